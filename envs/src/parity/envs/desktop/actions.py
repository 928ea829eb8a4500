"""Model actions → the guest's whitelist of operations. Nothing here is ever executed as code.

Two input forms, as in OSWorld:
* `computer_13` JSON: {"action_type": "CLICK", "parameters": {"x": 10, "y": 20, ...}} (the
  parameters may also sit at the top level);
* a pyautogui subset: one or more `pyautogui.<fn>(literal args)` calls (and `time.sleep(s)`),
  read with `ast` and mapped one by one; any other syntax is refused.
Plus the bare words WAIT, DONE and FAIL. Text may be wrapped in a ``` code fence.
Given the set-of-marks of the last observation (`marks`), an action may name mark N instead of
coordinates: `tag_N` as a pyautogui argument, or "mark": N in computer_13's parameters.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .guest.keys import keysym
from .marks import centre

_BUTTONS = {"left": 1, "middle": 2, "right": 3}
_FENCE = re.compile(r"```[a-zA-Z0-9_]*\s*\n?(.*?)```", re.DOTALL)
_TAG = re.compile(r"tag_(\d+)")


class ActionParseError(ValueError):
    """The action text is not a valid action; the message says what is wrong."""


@dataclass(frozen=True)
class Action:
    """A parsed action: `kind` is "ops" (perform `ops` in order), "wait", "done" or "fail";
    `marks` are the numbers of the marks it named."""

    kind: str
    ops: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    marks: tuple[int, ...] = ()


def parse(text: str | dict, width: int, height: int, marks: Sequence[dict] = ()) -> Action:
    """Parse one model action for a `width` x `height` screen, mark N being `marks[N - 1]`;
    raises ActionParseError."""
    if isinstance(text, dict):
        return _computer13(text, width, height, marks)
    if not isinstance(text, str):
        raise ActionParseError(f"action must be a string or an object, got {type(text).__name__}")
    fenced = _FENCE.search(text)
    body = (fenced.group(1) if fenced else text).strip()
    if body.upper() in ("WAIT", "DONE", "FAIL"):
        return Action(body.lower(), seconds=1.0 if body.upper() == "WAIT" else 0.0)
    if body.startswith("{"):
        try:
            doc = json.loads(body)
        except json.JSONDecodeError as e:
            raise ActionParseError(f"malformed JSON action: {e}") from e
        if not isinstance(doc, dict):
            raise ActionParseError("a JSON action must be an object")
        return _computer13(doc, width, height, marks)
    return _pyautogui(body, width, height, marks)


def _mark(value: object, marks: Sequence[dict]) -> tuple[int, int]:
    """The centre of mark `value` (numbered from 1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ActionParseError(f"mark must be an integer, got {value!r}")
    if not 1 <= value <= len(marks):
        shown = f"1..{len(marks)}" if marks else "none"
        raise ActionParseError(f"mark {value} does not exist (marks in the last observation: {shown})")
    return centre(marks[value - 1])


# --- computer_13 ---------------------------------------------------------------------------

def _computer13(doc: dict, width: int, height: int, marks: Sequence[dict]) -> Action:
    kind = doc.get("action_type")
    if not isinstance(kind, str):
        raise ActionParseError("JSON action needs a string field 'action_type'")
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise ActionParseError("'parameters' must be an object")
    p = {**{k: v for k, v in doc.items() if k not in ("action_type", "parameters")}, **params}
    kind = kind.upper()
    if "mark" in p:
        p["x"], p["y"] = _mark(p["mark"], marks)
        action = _computer13({"action_type": kind, **{k: v for k, v in p.items() if k != "mark"}}, width, height, ())
        return Action(action.kind, action.ops, action.seconds, (p["mark"],))
    if kind in ("DONE", "FAIL"):
        return Action(kind.lower())
    if kind == "WAIT":
        return Action("wait", seconds=_number(p.get("seconds", p.get("time", 1.0)), "seconds", 0, 10))
    xy = _point(p, width, height, required=kind in ("MOVE_TO", "DRAG_TO"))
    if kind == "MOVE_TO":
        return _ops({"op": "move", **xy})
    if kind in ("CLICK", "RIGHT_CLICK", "DOUBLE_CLICK"):
        button = 3 if kind == "RIGHT_CLICK" else _button(p.get("button", "left"))
        clicks = 2 if kind == "DOUBLE_CLICK" else _int(p.get("num_clicks", 1), "num_clicks", 1, 3)
        return _ops({"op": "click", **xy, "button": button, "clicks": clicks})
    if kind in ("MOUSE_DOWN", "MOUSE_UP"):
        return _ops({"op": kind.lower(), **xy, "button": _button(p.get("button", "left"))})
    if kind == "DRAG_TO":
        return _ops({"op": "drag", **xy, "button": 1})
    if kind == "SCROLL":
        return _ops(*_scroll(_int(p.get("dx", 0), "dx", -50, 50), _int(p.get("dy", 0), "dy", -50, 50), xy))
    if kind == "TYPING":
        return _ops(_type(p.get("text")))
    if kind == "PRESS":
        return _ops({"op": "key", "keys": [_key(p.get("key"))]})
    if kind in ("KEY_DOWN", "KEY_UP"):
        return _ops({"op": kind.lower(), "key": _key(p.get("key"))})
    if kind == "HOTKEY":
        keys = p.get("keys")
        if not isinstance(keys, list) or not keys:
            raise ActionParseError("HOTKEY needs 'keys': a non-empty list of key names")
        return _ops({"op": "key", "keys": [_key(k) for k in keys]})
    raise ActionParseError(f"unknown action_type {kind!r}")


# --- pyautogui subset ----------------------------------------------------------------------

_SIGNATURES: dict[str, tuple[str, ...]] = {
    "click": ("x", "y", "clicks", "interval", "button"), "doubleClick": ("x", "y", "interval", "button"),
    "tripleClick": ("x", "y", "interval", "button"), "rightClick": ("x", "y"), "middleClick": ("x", "y"),
    "moveTo": ("x", "y", "duration"), "dragTo": ("x", "y", "duration", "button"),
    "mouseDown": ("x", "y", "button"), "mouseUp": ("x", "y", "button"),
    "scroll": ("clicks", "x", "y"), "hscroll": ("clicks", "x", "y"), "vscroll": ("clicks", "x", "y"),
    "typewrite": ("message", "interval"), "write": ("message", "interval"),
    "press": ("keys", "presses", "interval"), "keyDown": ("key",), "keyUp": ("key",), "hotkey": (),
}


def _pyautogui(code: str, width: int, height: int, marks: Sequence[dict]) -> Action:
    try:
        tree = ast.parse(code, mode="exec")
    except SyntaxError as e:
        raise ActionParseError(f"not a valid action: {e.msg} (line {e.lineno})") from e
    ops: list[dict] = []
    used: list[int] = []

    def value(node: ast.expr) -> object:
        """A literal, or a mark's centre for the name tag_N."""
        if isinstance(node, ast.Name) and (m := _TAG.fullmatch(node.id)):
            used.append(int(m.group(1)))
            return _mark(used[-1], marks)
        return ast.literal_eval(node)

    for stmt in tree.body:
        if isinstance(stmt, ast.Import) and all(a.name in ("pyautogui", "time") for a in stmt.names):
            continue
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute) \
                or not isinstance(call.func.value, ast.Name):
            raise ActionParseError(f"only pyautogui.<function>(...) calls are allowed, got: {ast.unparse(stmt)[:80]}")
        module, fn = call.func.value.id, call.func.attr
        try:
            args = [value(a) for a in call.args]
            kwargs = {k.arg: value(k.value) for k in call.keywords if k.arg is not None}
        except ActionParseError:
            raise  # a mark that does not exist
        except ValueError as e:
            raise ActionParseError(f"{module}.{fn}: arguments must be literals") from e
        if module == "time" and fn == "sleep":
            if ops:
                raise ActionParseError("time.sleep is only allowed as the whole action")
            return Action("wait", seconds=_number(args[0] if args else kwargs.get("secs", 1.0), "seconds", 0, 10))
        if module != "pyautogui" or fn not in _SIGNATURES:
            raise ActionParseError(f"{module}.{fn} is not an allowed action")
        ops.extend(_pyautogui_call(fn, args, kwargs, width, height))
    if not ops:
        raise ActionParseError("empty action")
    return Action("ops", ops, marks=tuple(used))


def _pyautogui_call(fn: str, args: list, kwargs: dict, width: int, height: int) -> list[dict]:
    if fn == "hotkey":
        if kwargs.keys() - {"interval"} or not args:
            raise ActionParseError("pyautogui.hotkey takes key names as positional arguments")
        return [{"op": "key", "keys": [_key(k) for k in args]}]
    names = _SIGNATURES[fn]
    if len(args) > len(names):
        raise ActionParseError(f"pyautogui.{fn}: too many arguments")
    p = dict(zip(names, args, strict=False))
    unknown = kwargs.keys() - set(names)
    if unknown:
        raise ActionParseError(f"pyautogui.{fn}: unknown argument {sorted(unknown)[0]!r}")
    p.update(kwargs)
    if isinstance(p.get("x"), list | tuple):  # click((x, y))
        p["x"], p["y"] = p["x"]
    xy = _point(p, width, height, required=fn in ("moveTo", "dragTo"))
    if fn in ("click", "doubleClick", "tripleClick", "rightClick", "middleClick"):
        button = {"rightClick": 3, "middleClick": 2}.get(fn) or _button(p.get("button", "left"))
        clicks = {"doubleClick": 2, "tripleClick": 3}.get(fn) or _int(p.get("clicks", 1), "clicks", 1, 3)
        return [{"op": "click", **xy, "button": button, "clicks": clicks}]
    if fn == "moveTo":
        return [{"op": "move", **xy}]
    if fn == "dragTo":
        return [{"op": "drag", **xy, "button": _button(p.get("button", "left"))}]
    if fn in ("mouseDown", "mouseUp"):
        return [{"op": "mouse_down" if fn == "mouseDown" else "mouse_up", **xy, "button": _button(p.get("button", "left"))}]
    if fn in ("scroll", "vscroll", "hscroll"):
        clicks = _int(p.get("clicks"), "clicks", -50, 50)
        return _scroll(clicks if fn == "hscroll" else 0, 0 if fn == "hscroll" else clicks, xy)
    if fn in ("typewrite", "write"):
        message = p.get("message")
        if isinstance(message, list):  # typewrite(['a', 'enter']) presses keys
            return [{"op": "key", "keys": [_key(k)]} for k in message]
        return [_type(message)]
    if fn == "press":
        keys = p.get("keys")
        keys = [keys] if isinstance(keys, str) else keys
        if not isinstance(keys, list) or not keys:
            raise ActionParseError("pyautogui.press needs a key name or a list of key names")
        presses = _int(p.get("presses", 1), "presses", 1, 20)
        if len(keys) == 1 and presses > 1:
            # one operation, so one settle: after each of 6 Down presses Calc's screen took
            # ~170 ms to settle, 1.1 s for the step where the last press is all that counts
            return [{"op": "key", "keys": [_key(keys[0])], "repeat": presses}]
        return [{"op": "key", "keys": [_key(k)]} for _ in range(presses) for k in keys]
    return [{"op": "key_down" if fn == "keyDown" else "key_up", "key": _key(p.get("key"))}]


# --- shared checks -------------------------------------------------------------------------

def _ops(*ops: dict) -> Action:
    return Action("ops", list(ops))


def _int(value: object, name: str, lo: int, hi: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ActionParseError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ActionParseError(f"{name}={value} is out of range {lo}..{hi}")
    return value


def _number(value: object, name: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ActionParseError(f"{name} must be a number in {lo:g}..{hi:g}, got {value!r}")
    return float(value)


def _point(p: dict, width: int, height: int, required: bool) -> dict:
    x, y = p.get("x"), p.get("y")
    if x is None and y is None and not required:
        return {}
    if x is None or y is None:
        raise ActionParseError("needs both x and y")
    for name, v, size in (("x", x, width), ("y", y, height)):
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ActionParseError(f"{name} must be a number, got {v!r}")
        if not 0 <= v < size:
            raise ActionParseError(f"coordinate {name}={v} is off screen (screen is {width}x{height})")
    return {"x": int(x), "y": int(y)}


def _button(name: object) -> int:
    if name not in _BUTTONS:
        raise ActionParseError(f"button must be one of {sorted(_BUTTONS)}, got {name!r}")
    return _BUTTONS[name]  # type: ignore[index]


def _key(name: object) -> str:
    if not isinstance(name, str):
        raise ActionParseError(f"key name must be a string, got {name!r}")
    try:
        return keysym(name)
    except KeyError as e:
        raise ActionParseError(e.args[0]) from None


def _type(text: object) -> dict:
    if not isinstance(text, str) or not text:
        raise ActionParseError("text to type must be a non-empty string")
    if len(text) > 2000:
        raise ActionParseError(f"text to type is {len(text)} characters; the limit is 2000")
    return {"op": "type", "text": text}


def _scroll(dx: int, dy: int, xy: dict) -> list[dict]:
    ops = []
    if dy:
        ops.append({"op": "scroll", **xy, "direction": "up" if dy > 0 else "down", "amount": abs(dy)})
    if dx:
        ops.append({"op": "scroll", **xy, "direction": "right" if dx > 0 else "left", "amount": abs(dx)})
    if not ops:
        raise ActionParseError("scroll amount must not be zero")
    return ops
