"""Set-of-marks: numbered boxes over the interactive elements of the accessibility tree.

The "som" observation is the screenshot with a numbered box over each interactive element
and a table `mark, tag, name, text, position, size` of the same marks. Actions may name a
mark instead of coordinates: `pyautogui.click(tag_3)` (as in OSWorld's set-of-marks agents)
or {"action_type": "CLICK", "parameters": {"mark": 3}}; the mark's centre is used. Marks are
numbered from 1 in tree order and hold for the next action only.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .a11y import clean

INTERACTIVE = frozenset({
    "push-button", "toggle-button", "entry", "text", "password-text", "list-item", "check-box",
    "radio-button", "spin-button", "combo-box", "menu-item", "menu", "page-tab", "link", "table-cell",
    "slider", "tree-item", "icon",
})
"""Tags (AT-SPI role names) that a click or typing can act on."""

_RED = (230, 20, 20)


def marks_of(rows: list[dict]) -> list[dict]:
    """The interactive rows that are visible (non-empty box), in tree order: mark i+1 is row i."""
    return [r for r in rows if r["tag"] in INTERACTIVE and r["w"] > 0 and r["h"] > 0]


def centre(row: dict) -> tuple[int, int]:
    """The centre of a row's box (what an action on its mark clicks)."""
    return row["x"] + row["w"] // 2, row["y"] + row["h"] // 2


def same_element(a: dict, b: dict) -> bool:
    """Whether two rows are the same element in the same place (text may have changed)."""
    return all(a[k] == b[k] for k in ("tag", "name", "x", "y", "w", "h"))


def draw(screenshot: np.ndarray, marks: list[dict]) -> np.ndarray:
    """A copy of the (H, W, 3) screenshot with each mark's box outlined and numbered."""
    image = Image.fromarray(screenshot)
    pen = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    for i, m in enumerate(marks, start=1):
        x0, y0 = m["x"], m["y"]
        pen.rectangle((x0, y0, x0 + m["w"] - 1, y0 + m["h"] - 1), outline=_RED, width=2)
        label = str(i)
        width = pen.textlength(label, font=font)
        at = (max(x0, x0 + m["w"] - width - 3), y0 + 1)  # top-right corner: text is mostly left-aligned
        left, top, right, bottom = pen.textbbox(at, label, font=font)
        pen.rectangle((left - 1, top - 1, right + 1, bottom + 1), fill=_RED)
        pen.text(at, label, fill=(255, 255, 255), font=font)
    return np.asarray(image, dtype=np.uint8).copy()


def table(marks: list[dict]) -> str:
    """The marks as a tab-separated table, one row per mark."""
    lines = ["mark\ttag\tname\ttext\tposition\tsize"]
    for i, m in enumerate(marks, start=1):
        fields = [" ".join(str(m[k]).split())[:200] for k in ("tag", "name", "text")]
        lines.append("\t".join([str(i), *fields, f"({m['x']}, {m['y']})", f"({m['w']}, {m['h']})"]))
    return clean("\n".join(lines))
