"""Input: the whitelist of desktop operations, checked and then executed with xdotool (XTEST).

An operation is a dict with `op` and its fields, already normalised by the host's parser;
this module checks it again (the guest trusts nothing) and never runs a shell.
"""

from __future__ import annotations

import subprocess
import time

from .keys import ALLOWED_KEYSYMS

MAX_TYPE_CHARS = 2000
MAX_WAIT_S = 10.0
_SCROLL_BUTTONS = {"up": "4", "down": "5", "left": "6", "right": "7"}


class ActionError(ValueError):
    """An operation that is not in the whitelist or has a bad field; the message names it."""


def _int(op: dict, key: str, lo: int, hi: int) -> int:
    value = op.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ActionError(f"{op.get('op')}: field {key!r} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        where = "off screen" if key in ("x", "y") else "out of range"
        raise ActionError(f"{op.get('op')}: {key}={value} is {where} (allowed {lo}..{hi})")
    return value


def _key(op: dict, name: object) -> str:
    if not isinstance(name, str) or name not in ALLOWED_KEYSYMS:
        raise ActionError(f"{op.get('op')}: key {name!r} is not an allowed key")
    return name


def _button(op: dict) -> str:
    button = op.get("button", 1)
    if button not in (1, 2, 3):
        raise ActionError(f"{op.get('op')}: button must be 1, 2 or 3, got {button!r}")
    return str(button)


def commands(op: dict, width: int, height: int) -> list[list[str]]:
    """The xdotool command lines for one operation; raises ActionError if it is not allowed."""
    kind = op.get("op")
    pos: list[str] = []
    if "x" in op or "y" in op:
        pos = ["mousemove", str(_int(op, "x", 0, width - 1)), str(_int(op, "y", 0, height - 1))]
    if kind == "move":
        if not pos:
            raise ActionError("move: needs x and y")
        return [["xdotool", *pos]]
    if kind == "click":
        clicks = _int(op, "clicks", 1, 3) if "clicks" in op else 1
        return [["xdotool", *pos, "click", "--repeat", str(clicks), "--delay", "30", _button(op)]]
    if kind in ("mouse_down", "mouse_up"):
        return [["xdotool", *pos, kind.replace("_", ""), _button(op)]]
    if kind == "drag":
        if not pos:
            raise ActionError("drag: needs x and y")
        return [["xdotool", "mousedown", _button(op)], ["xdotool", *pos], ["xdotool", "mouseup", _button(op)]]
    if kind == "scroll":
        direction = op.get("direction")
        if direction not in _SCROLL_BUTTONS:
            raise ActionError(f"scroll: direction must be one of {sorted(_SCROLL_BUTTONS)}, got {direction!r}")
        amount = _int(op, "amount", 1, 50)
        return [["xdotool", *pos, "click", "--repeat", str(amount), "--delay", "10", _SCROLL_BUTTONS[direction]]]
    if kind == "type":
        text = op.get("text")
        if not isinstance(text, str) or not text or len(text) > MAX_TYPE_CHARS:
            raise ActionError(f"type: text must be a non-empty string of at most {MAX_TYPE_CHARS} characters")
        return [["xdotool", "type", "--delay", "4", "--", text]]
    if kind == "key":
        keys = op.get("keys")
        if not isinstance(keys, list) or not keys or len(keys) > 5:
            raise ActionError("key: keys must be a list of 1 to 5 key names")
        repeat = _int(op, "repeat", 1, 20) if "repeat" in op else 1
        return [["xdotool", "key", "--repeat", str(repeat), "--delay", "20", "+".join(_key(op, k) for k in keys)]]
    if kind in ("key_down", "key_up"):
        return [["xdotool", kind.replace("_", ""), _key(op, op.get("key"))]]
    if kind == "wait":
        return []
    raise ActionError(f"unknown operation {kind!r}")


def execute(op: dict, width: int, height: int, env: dict[str, str]) -> None:
    """Check and perform one operation on the display named in `env`."""
    cmds = commands(op, width, height)
    if op.get("op") == "wait":
        seconds = op.get("seconds", 1.0)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= MAX_WAIT_S:
            raise ActionError(f"wait: seconds must be a number in 0..{MAX_WAIT_S}, got {seconds!r}")
        time.sleep(seconds)
    for cmd in cmds:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise ActionError(f"{op.get('op')}: xdotool failed: {done.stderr.strip()[:200]}")
