"""Set-of-marks: marks from the tree, drawn boxes, actions that name marks, stale marks."""

from __future__ import annotations

import numpy as np
import pytest
from desktop_support import needs_apps, needs_desktop

from parity.envs.desktop.actions import ActionParseError, parse
from parity.envs.desktop.env import DesktopEnv
from parity.envs.desktop.marks import draw, marks_of, table

ROWS = [
    {"tag": "window", "name": "Editor", "text": "", "class": "Window", "description": "active",
     "x": 0, "y": 0, "w": 1024, "h": 768},
    {"tag": "push-button", "name": "Save", "text": "", "class": "Button", "description": "",
     "x": 100, "y": 40, "w": 60, "h": 20},
    {"tag": "label", "name": "Status", "text": "ok", "class": "Label", "description": "", "x": 0, "y": 700, "w": 80,
     "h": 20},
    {"tag": "entry", "name": "File name", "text": "a.txt", "class": "Entry", "description": "",
     "x": 200, "y": 40, "w": 300, "h": 20},
    {"tag": "push-button", "name": "Hidden", "text": "", "class": "Button", "description": "",
     "x": 5, "y": 5, "w": 0, "h": 0},
]


def test_marks_are_the_visible_interactive_rows_in_order() -> None:
    marks = marks_of(ROWS)
    assert [m["name"] for m in marks] == ["Save", "File name"]
    assert table(marks).split("\n") == ["mark\ttag\tname\ttext\tposition\tsize",
                                        "1\tpush-button\tSave\t\t(100, 40)\t(60, 20)",
                                        "2\tentry\tFile name\ta.txt\t(200, 40)\t(300, 20)"]


def test_draw_outlines_each_mark_and_leaves_the_rest() -> None:
    screen = np.full((768, 1024, 3), 255, np.uint8)
    drawn = draw(screen, marks_of(ROWS))
    assert (screen == 255).all()  # the input is not modified
    assert tuple(drawn[50, 100]) == (230, 20, 20) and tuple(drawn[50, 159]) == (230, 20, 20)  # box edges
    assert tuple(drawn[50, 130]) == (255, 255, 255)  # inside the box
    assert (drawn[300:600, 600:900] == 255).all()  # nowhere near a mark


def test_actions_name_marks_in_both_forms() -> None:
    marks = marks_of(ROWS)
    act = parse("pyautogui.click(tag_1)", 1024, 768, marks)
    assert act.ops == [{"op": "click", "x": 130, "y": 50, "button": 1, "clicks": 1}] and act.marks == (1,)
    act = parse('{"action_type": "DOUBLE_CLICK", "parameters": {"mark": 2}}', 1024, 768, marks)
    assert act.ops == [{"op": "click", "x": 350, "y": 50, "button": 1, "clicks": 2}] and act.marks == (2,)
    with pytest.raises(ActionParseError, match=r"mark 3 does not exist \(marks in the last observation: 1\.\.2\)"):
        parse("pyautogui.click(tag_3)", 1024, 768, marks)
    with pytest.raises(ActionParseError, match=r"mark 1 does not exist \(marks in the last observation: none\)"):
        parse('{"action_type": "CLICK", "mark": 1}', 1024, 768)
    with pytest.raises(ActionParseError, match="arguments must be literals"):
        parse("pyautogui.click(tags)", 1024, 768, marks)


@needs_desktop
def test_som_observation_acts_on_marks_and_refuses_a_stale_one() -> None:
    env = DesktopEnv(backend="local", obs_mode="som")
    try:
        obs, _ = env.reset(options={"task_id": "textedit-new-file"})
        assert set(obs) == {"instruction", "feedback", "screenshot", "marks"}
        number = {line.split("\t")[2]: int(line.split("\t")[0]) for line in obs["marks"].split("\n")[1:]}
        assert {"Document", "Save", "File name"} <= number.keys() and "Status" not in number  # a label
        assert (obs["screenshot"] == np.array([230, 20, 20], np.uint8)).all(axis=2).sum() > 500  # boxes drawn
        obs, _, _, _, info = env.step(f"pyautogui.click(tag_{number['Document']}); pyautogui.typewrite('hi')")
        assert "error" not in info
        assert "\tDocument\thi\t" in obs["marks"]
        env.client.setup({"type": "launch", "parameters": {"command": ["files"]}})  # type: ignore[union-attr]
        obs, _, _, _, info = env.step(f'{{"action_type": "CLICK", "parameters": {{"mark": {number["Save"]}}}}}')
        assert info["error"] == (f"error: mark {number['Save']} (push-button 'Save') is no longer on screen; "
                                 "nothing was done")
        assert env.client.file("~/hello.txt")["exists"] is False  # type: ignore[union-attr]
        assert "\tSave\t" not in obs["marks"] and "\tNew Folder\t" in obs["marks"]  # marks of the new window
    finally:
        env.close()


@needs_desktop
@pytest.mark.parametrize("task_id", [pytest.param("browser-follow-link", marks=needs_apps(["firefox", "atspi"]))])
def test_som_marks_a_real_browser_page(task_id: str) -> None:
    env = DesktopEnv(backend="local", obs_mode="som")
    try:
        obs, _ = env.reset(options={"task_id": task_id})
        number = {(line.split("\t")[1], line.split("\t")[2]): int(line.split("\t")[0])
                  for line in obs["marks"].split("\n")[1:]}
        assert {("link", "Contact"), ("link", "Opening hours"), ("combo-box", "Enter address"),
                ("push-button", "Back"), ("page-tab", "Corner shop")} <= number.keys()
        _, _, _, _, info = env.step(f"pyautogui.click(tag_{number[('link', 'Opening hours')]})")
        assert "error" not in info
        assert env.step("DONE")[1] == 1.0
    finally:
        env.close()
