"""Set-of-marks: marks from the tree (each element once), drawn boxes, numbers beside their boxes,
actions that name marks, stale marks, Calc's marks."""

from __future__ import annotations

import numpy as np
import pytest
from desktop_support import needs_apps, needs_desktop

from parity.envs.desktop.actions import ActionParseError, parse
from parity.envs.desktop.env import DesktopEnv
from parity.envs.desktop.marks import (
    draw,
    duplicate,
    label_rects,
    marks_of,
    overlap,
    place_labels,
    rect,
    table,
)

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
    assert tuple(drawn[35, 101]) == (230, 20, 20) and tuple(drawn[44, 155]) == (255, 255, 255)  # "1" above, not in
    assert (drawn[300:600, 600:900] == 255).all()  # nowhere near a mark


def _row(tag: str, name: str, x: int, y: int, w: int, h: int, text: str = "") -> dict:
    return {"tag": tag, "name": name, "text": text, "class": "atspi", "description": "", "x": x, "y": y, "w": w, "h": h}


def test_an_element_exposed_twice_gets_one_mark() -> None:
    rows = [_row("menu", "File", 0, 19, 39, 25), _row("menu", "Edit", 39, 19, 41, 25),
            _row("menu", "File", 0, 19, 35, 19, "File"), _row("menu-item", "", 40, 20, 38, 23),
            _row("combo-box", "Enter address", 100, 60, 300, 30), _row("entry", "", 102, 62, 296, 26, "http://a/"),
            _row("push-button", "Back", 400, 60, 30, 30), _row("push-button", "Forward", 430, 60, 30, 30),
            _row("push-button", "Back", 500, 60, 30, 30)]  # the same name elsewhere: another element
    assert [(m["tag"], m["name"], m["x"]) for m in marks_of(rows)] == [
        ("menu", "File", 0), ("menu", "Edit", 39), ("combo-box", "Enter address", 100), ("push-button", "Back", 400),
        ("push-button", "Forward", 430), ("push-button", "Back", 500)]


def test_numbers_go_beside_their_boxes_apart_from_each_other() -> None:
    # A at the screen's top-left corner, B right of it, C below it: no room above A or B
    boxes = [(0, 0, 30, 20), (30, 0, 60, 20), (0, 20, 30, 40)]
    labels = place_labels(boxes, [(8, 10)] * 3, (200, 100))
    assert labels == [(0, 20, 8, 30), (30, 20, 38, 30), (0, 40, 8, 50)]
    assert place_labels([(0, 0, 200, 100)], [(8, 10)], (200, 100)) == [(0, 0, 8, 10)]  # no room outside: inside


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


@needs_desktop
@pytest.mark.parametrize("task_id", [pytest.param("calc-average", marks=needs_apps(["libreoffice_calc", "atspi"]))])
def test_calc_marks_each_element_once_readably_and_reach_the_cells(task_id: str) -> None:
    env = DesktopEnv(backend="local", obs_mode="som")
    try:
        env.reset(options={"task_id": task_id})
        marks = env.marks
        assert [m["name"] for m in marks if m["tag"] == "menu"] == [
            "File", "Edit", "View", "Insert", "Format", "Styles", "Sheet", "Data", "Tools", "Window", "Help"]
        assert [(i, j) for i in range(len(marks)) for j in range(i) if duplicate(marks[j], marks[i])] == []
        labels = label_rects(marks, (1024, 768))
        assert [(i, j) for i in range(len(labels)) for j in range(i) if overlap(labels[i], labels[j])] == []
        assert [i for i, m in enumerate(marks) if overlap(labels[i], rect(m))] == []
        # the cells: the sheet itself, and the Name Box (the `text` mark holding the cell address)
        number = {(m["tag"], m["name"] or m["text"]): i for i, m in enumerate(marks, start=1)}
        assert ("table", "Sheet Sheet1") in number
        name_box = f"pyautogui.click(tag_{number[('text', 'A1')]})"
        env.step(f"{name_box}; pyautogui.typewrite('A5'); pyautogui.press('enter')")
        env.step("pyautogui.typewrite('mean'); pyautogui.press('enter')")
        obs, *_ = env.step(f"{name_box}; pyautogui.typewrite('B5'); pyautogui.press('enter')")
        assert "\ttext\t\tB5\t" in obs["marks"]
        env.step("pyautogui.typewrite('=AVERAGE(B2:B4)'); pyautogui.press('enter'); pyautogui.hotkey('ctrl', 's')")
        assert env.step("DONE")[1] == 1.0
    finally:
        env.close()
