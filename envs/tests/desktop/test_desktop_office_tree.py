"""LibreOffice's content in the accessibility tree (GTK 3 plugin, AT-SPI): Calc's cells on
screen and its active cell, Writer's paragraphs on screen and the one holding the cursor,
Impress's shapes on the slide (`guest/atspi.py`, `_cells` and the walk of documents)."""

from __future__ import annotations

import pytest
from desktop_support import needs_apps, needs_desktop

from parity.envs.desktop.env import DesktopEnv

pytestmark = needs_desktop


def _cells(rows: list[dict]) -> dict[str, str]:
    return {r["name"]: r["text"] for r in rows if r["tag"] == "table-cell"}


def _focused(rows: list[dict], tag: str) -> list[tuple[str, str]]:
    return [(r["name"], r["text"]) for r in rows if r["tag"] == tag and "focused" in r["description"].split(",")]


@pytest.mark.parametrize("task_id", [pytest.param("calc-max", marks=needs_apps(["libreoffice_calc", "atspi"]))])
def test_calc_tree_has_the_cells_on_screen_and_the_active_one(env: DesktopEnv, task_id: str) -> None:
    obs, _ = env.reset(options={"task_id": task_id})
    rows = env.rows()
    assert _cells(rows) == {"A1": "name", "B1": "score", "A2": "ann", "B2": "71", "A3": "bob", "B3": "84",
                            "A4": "cy", "B4": "90"}
    assert _focused(rows, "table-cell") == [("A1", "name")]
    # the cells come last (after the status bar), the active cell first
    first = next(i for i, r in enumerate(rows) if r["tag"] == "table-cell")
    assert rows[first]["name"] == "A1" and rows[first - 1]["tag"] == "label" and len(rows) == first + 8
    assert "\ntable-cell\tB2\t71\tatspi\t\t(" in obs["accessibility_tree"]
    # an empty active cell is there too; typed text shows up in it
    env.step("pyautogui.hotkey('ctrl', 'home'); pyautogui.press('right'); pyautogui.press('down', presses=4)")
    assert _focused(env.rows(), "table-cell") == [("B5", "")]
    env.step("pyautogui.typewrite('42'); pyautogui.press('enter')")
    rows = env.rows()
    assert _cells(rows)["B5"] == "42" and _focused(rows, "table-cell") == [("B6", "")]
    # each cell's box is where it is drawn: a click in the middle of B3's box makes B3 active
    b3 = next(r for r in rows if r["tag"] == "table-cell" and r["name"] == "B3")
    env.step(f"pyautogui.click({b3['x'] + b3['w'] // 2}, {b3['y'] + b3['h'] // 2})")
    assert _focused(env.rows(), "table-cell") == [("B3", "84")]


@pytest.mark.parametrize("task_id", [pytest.param("calc-max", marks=needs_apps(["libreoffice_calc", "atspi"]))])
def test_calc_tree_lists_only_the_cells_on_screen(env: DesktopEnv, task_id: str) -> None:
    """A read looks at the cells on screen only (a sheet has 2^34): on the sheet's last row the
    task's cells are gone, and the cells there are named by their address all the same."""
    env.reset(options={"task_id": task_id})
    env.step("pyautogui.hotkey('ctrl', 'down'); pyautogui.hotkey('ctrl', 'down')")  # A4 (the data's end), A1048576
    env.step("pyautogui.typewrite('far'); pyautogui.press('enter')")
    rows = env.rows()
    assert _cells(rows) == {"A1048576": "far"} and _focused(rows, "table-cell") == [("A1048576", "far")]


@pytest.mark.parametrize("task_id", [pytest.param("writer-fix-typo", marks=needs_apps(["libreoffice_writer", "atspi"]))])
def test_writer_tree_has_the_paragraphs_and_the_one_with_the_cursor(env: DesktopEnv, task_id: str) -> None:
    obs, _ = env.reset(options={"task_id": task_id})
    rows = env.rows()
    assert [r["text"] for r in rows if r["tag"] == "paragraph"] == ["Dear team,", "You will recieve the report."]
    assert _focused(rows, "paragraph") == [("", "Dear team,")]
    assert "\nparagraph\t\tYou will recieve the report.\tatspi\t\t(" in obs["accessibility_tree"]
    env.step("pyautogui.hotkey('ctrl', 'end'); pyautogui.typewrite(' Thanks.')")
    rows = env.rows()
    assert _focused(rows, "paragraph") == [("", "You will recieve the report. Thanks.")]
    # each paragraph's box is where it is drawn: a click in the first one puts the cursor there
    first = next(r for r in rows if r["tag"] == "paragraph")
    env.step(f"pyautogui.click({first['x'] + first['w'] // 2}, {first['y'] + first['h'] // 2})")
    assert _focused(env.rows(), "paragraph") == [("", "Dear team,")]


@pytest.mark.parametrize("task_id", [pytest.param("impress-edit-title",
                                                  marks=needs_apps(["libreoffice_impress", "atspi"]))])
def test_impress_tree_has_the_slide_shapes_and_their_text(env: DesktopEnv, task_id: str) -> None:
    env.reset(options={"task_id": task_id})
    rows = env.rows()
    doc = next(i for i, r in enumerate(rows) if r["tag"] == "document-presentation")
    slide = [(r["tag"], r["name"], r["text"]) for r in rows[doc + 1: doc + 8]]
    assert slide == [("panel", "PageShape: Draft agenda", ""), ("panel", "Title 1", ""),
                     ("paragraph", "", "Draft agenda"), ("panel", "Content Placeholder 2", ""),
                     ("paragraph", "", "Welcome"), ("paragraph", "", "Budget"), ("paragraph", "", "Questions")]
    assert ("panel", "Draft agenda") in {(r["tag"], r["name"]) for r in rows}  # the slide in the slide pane
