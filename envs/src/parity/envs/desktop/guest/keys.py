"""The whitelist of key names: pyautogui's names mapped to X keysyms for xdotool."""

from __future__ import annotations

import string

_NAMED: dict[str, str] = {
    "enter": "Return", "return": "Return", "\n": "Return", "tab": "Tab", "\t": "Tab",
    "space": "space", " ": "space", "esc": "Escape", "escape": "Escape",
    "backspace": "BackSpace", "delete": "Delete", "del": "Delete", "insert": "Insert",
    "home": "Home", "end": "End", "pageup": "Prior", "pgup": "Prior", "pagedown": "Next",
    "pgdn": "Next", "up": "Up", "down": "Down", "left": "Left", "right": "Right",
    "ctrl": "ctrl", "ctrlleft": "Control_L", "ctrlright": "Control_R", "control": "ctrl",
    "shift": "shift", "shiftleft": "Shift_L", "shiftright": "Shift_R",
    "alt": "alt", "altleft": "Alt_L", "altright": "Alt_R", "option": "alt",
    "win": "super", "winleft": "Super_L", "winright": "Super_R", "super": "super",
    "command": "super", "capslock": "Caps_Lock", "printscreen": "Print", "menu": "Menu",
}
_PUNCT: dict[str, str] = {
    "!": "exclam", '"': "quotedbl", "#": "numbersign", "$": "dollar", "%": "percent",
    "&": "ampersand", "'": "apostrophe", "(": "parenleft", ")": "parenright",
    "*": "asterisk", "+": "plus", ",": "comma", "-": "minus", ".": "period", "/": "slash",
    ":": "colon", ";": "semicolon", "<": "less", "=": "equal", ">": "greater",
    "?": "question", "@": "at", "[": "bracketleft", "\\": "backslash", "]": "bracketright",
    "^": "asciicircum", "_": "underscore", "`": "grave", "{": "braceleft", "|": "bar",
    "}": "braceright", "~": "asciitilde",
}

KEYSYMS: dict[str, str] = {
    **{c: c for c in string.ascii_letters + string.digits},
    **{f"f{i}": f"F{i}" for i in range(1, 13)},
    **_PUNCT,
    **_NAMED,
}
"""Every accepted key name (as pyautogui spells it, case-insensitive for named keys) → keysym."""

ALLOWED_KEYSYMS: frozenset[str] = frozenset(KEYSYMS.values())
"""The keysyms the guest will pass to xdotool; anything else is refused."""


def keysym(name: str) -> str:
    """The X keysym for a pyautogui key name; raises KeyError naming the key if unknown."""
    if name in KEYSYMS:
        return KEYSYMS[name]
    if name.lower() in KEYSYMS and len(name) > 1:
        return KEYSYMS[name.lower()]
    raise KeyError(f"unknown key name {name!r}")
