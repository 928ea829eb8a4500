"""The action parser: computer_13 JSON and the pyautogui subset map onto the guest whitelist."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.envs.desktop.actions import Action, ActionParseError, parse
from parity.envs.desktop.guest.keys import KEYSYMS
from parity.envs.desktop.guest.xinput import ActionError, commands

W, H = 1024, 768


@pytest.mark.parametrize(("text", "ops"), [
    ('{"action_type": "CLICK", "parameters": {"x": 10, "y": 20}}',
     [{"op": "click", "x": 10, "y": 20, "button": 1, "clicks": 1}]),
    ('{"action_type": "DOUBLE_CLICK", "x": 5, "y": 6}', [{"op": "click", "x": 5, "y": 6, "button": 1, "clicks": 2}]),
    ('{"action_type": "RIGHT_CLICK"}', [{"op": "click", "button": 3, "clicks": 1}]),
    ('{"action_type": "MOVE_TO", "parameters": {"x": 1023, "y": 767}}', [{"op": "move", "x": 1023, "y": 767}]),
    ('{"action_type": "DRAG_TO", "parameters": {"x": 1, "y": 2}}', [{"op": "drag", "x": 1, "y": 2, "button": 1}]),
    ('{"action_type": "SCROLL", "parameters": {"dx": 2, "dy": -3}}',
     [{"op": "scroll", "direction": "down", "amount": 3}, {"op": "scroll", "direction": "right", "amount": 2}]),
    ('{"action_type": "TYPING", "parameters": {"text": "hi there"}}', [{"op": "type", "text": "hi there"}]),
    ('{"action_type": "PRESS", "parameters": {"key": "enter"}}', [{"op": "key", "keys": ["Return"]}]),
    ('{"action_type": "HOTKEY", "parameters": {"keys": ["ctrl", "shift", "t"]}}',
     [{"op": "key", "keys": ["ctrl", "shift", "t"]}]),
    ('{"action_type": "KEY_DOWN", "parameters": {"key": "shift"}}', [{"op": "key_down", "key": "shift"}]),
    ("pyautogui.click(100, 200, button='right')", [{"op": "click", "x": 100, "y": 200, "button": 3, "clicks": 1}]),
    ("pyautogui.click((3, 4))", [{"op": "click", "x": 3, "y": 4, "button": 1, "clicks": 1}]),
    ("import pyautogui\npyautogui.doubleClick(x=7, y=8)", [{"op": "click", "x": 7, "y": 8, "button": 1, "clicks": 2}]),
    ("pyautogui.typewrite('ab', interval=0.1)", [{"op": "type", "text": "ab"}]),
    ("pyautogui.typewrite(['a', 'enter'])", [{"op": "key", "keys": ["a"]}, {"op": "key", "keys": ["Return"]}]),
    ("pyautogui.press('tab', presses=2)", [{"op": "key", "keys": ["Tab"], "repeat": 2}]),
    ("pyautogui.press(['a', 'b'], presses=2)", [{"op": "key", "keys": ["a"]}, {"op": "key", "keys": ["b"]},
                                                {"op": "key", "keys": ["a"]}, {"op": "key", "keys": ["b"]}]),
    ("pyautogui.hotkey('ctrl', 'S')", [{"op": "key", "keys": ["ctrl", "S"]}]),
    ("pyautogui.scroll(5)", [{"op": "scroll", "direction": "up", "amount": 5}]),
    ("pyautogui.hscroll(-1, x=1, y=1)", [{"op": "scroll", "x": 1, "y": 1, "direction": "left", "amount": 1}]),
    ("pyautogui.moveTo(1, 2); pyautogui.mouseDown(); pyautogui.mouseUp(button='right')",
     [{"op": "move", "x": 1, "y": 2}, {"op": "mouse_down", "button": 1}, {"op": "mouse_up", "button": 3}]),
    ("```python\npyautogui.write('x')\n```", [{"op": "type", "text": "x"}]),
])
def test_actions_parse_to_whitelisted_ops(text: str, ops: list[dict]) -> None:
    action = parse(text, W, H)
    assert action == Action("ops", ops)
    for op in action.ops:  # the guest accepts exactly what the host produces
        assert commands(op, W, H)


@pytest.mark.parametrize(("text", "kind", "seconds"), [
    ("WAIT", "wait", 1.0), ("done", "done", 0.0), ("FAIL", "fail", 0.0), ("time.sleep(2.5)", "wait", 2.5),
    ('{"action_type": "WAIT", "parameters": {"seconds": 3}}', "wait", 3.0), ('{"action_type": "DONE"}', "done", 0.0),
])
def test_control_actions(text: str, kind: str, seconds: float) -> None:
    assert parse(text, W, H) == Action(kind, [], seconds)


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "malformed JSON action"),
    ("[1, 2]", "only pyautogui.<function>(...) calls are allowed"),
    ('{"parameters": {}}', "needs a string field 'action_type'"),
    ('{"action_type": "TELEPORT"}', "unknown action_type 'TELEPORT'"),
    ('{"action_type": "CLICK", "parameters": {"x": 1024, "y": 5}}', "coordinate x=1024 is off screen (screen is 1024x768)"),
    ('{"action_type": "CLICK", "parameters": {"x": -1, "y": 5}}', "coordinate x=-1 is off screen"),
    ('{"action_type": "CLICK", "parameters": {"x": 5}}', "needs both x and y"),
    ('{"action_type": "CLICK", "parameters": {"x": "5", "y": 5}}', "x must be a number, got '5'"),
    ('{"action_type": "PRESS", "parameters": {"key": "hyperspace"}}', "unknown key name 'hyperspace'"),
    ('{"action_type": "HOTKEY", "parameters": {"keys": []}}', "HOTKEY needs 'keys'"),
    ('{"action_type": "TYPING", "parameters": {"text": ""}}', "text to type must be a non-empty string"),
    ('{"action_type": "CLICK", "parameters": {"button": "thumb"}}', "button must be one of"),
    ('{"action_type": "SCROLL", "parameters": {"dx": 0, "dy": 0}}', "scroll amount must not be zero"),
    ("pyautogui.click(5000, 1)", "coordinate x=5000 is off screen"),
    ("pyautogui.press('nokey')", "unknown key name 'nokey'"),
    ("os.system('rm -rf /')", "os.system is not an allowed action"),
    ("__import__('os').system('id')", "only pyautogui.<function>(...) calls are allowed"),
    ("pyautogui.click(x=open('/etc/passwd'))", "arguments must be literals"),
    ("pyautogui.screenshot()", "pyautogui.screenshot is not an allowed action"),
    ("pyautogui.click(1, 2, nonsense=3)", "unknown argument 'nonsense'"),
    ("x = 1", "only pyautogui.<function>(...) calls are allowed"),
    ("pyautogui.click(", "not a valid action"),
    ("", "empty action"),
])
def test_bad_actions_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(ActionParseError) as err:
        parse(text, W, H)
    assert message in str(err.value)


def test_every_key_name_maps_to_a_keysym_the_guest_accepts() -> None:
    for name in KEYSYMS:
        assert commands({"op": "key", "keys": [KEYSYMS[name]]}, W, H)


@pytest.mark.parametrize(("op", "message"), [
    ({"op": "exec", "cmd": "id"}, "unknown operation 'exec'"),
    ({"op": "click", "x": 1024, "y": 0}, "x=1024 is off screen"),
    ({"op": "key", "keys": ["Return; rm -rf /"]}, "is not an allowed key"),
    ({"op": "type", "text": "x" * 2001}, "at most 2000 characters"),
    ({"op": "click", "button": 9}, "button must be 1, 2 or 3"),
    ({"op": "key", "keys": ["Down"], "repeat": 21}, "key: repeat=21 is out of range (allowed 1..20)"),
])
def test_guest_rechecks_operations(op: dict, message: str) -> None:
    with pytest.raises(ActionError) as err:
        commands(op, W, H)
    assert message in str(err.value)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.from_regex(r"pyautogui\.[a-zA-Z]+\(.{0,40}\)", fullmatch=True),
                 st.from_regex(r"\{\"action_type\": \"[A-Z_]{3,12}\".{0,60}\}", fullmatch=True)))
def test_any_text_parses_or_is_refused_cleanly(text: str) -> None:
    try:
        action = parse(text, W, H)
    except ActionParseError:
        return
    for op in action.ops:
        assert commands(op, W, H) is not None
