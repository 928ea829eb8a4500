"""Set-of-marks: numbered boxes over the interactive elements of the accessibility tree.

The "som" observation is the screenshot with a numbered box over each interactive element
and a table `mark, tag, name, text, position, size` of the same marks. Actions may name a
mark instead of coordinates: `pyautogui.click(tag_3)` (as in OSWorld's set-of-marks agents)
or {"action_type": "CLICK", "parameters": {"mark": 3}}; the mark's centre is used. Marks are
numbered from 1 in tree order and hold for the next action only.

One mark per on-screen element: a row whose box nearly matches an earlier mark's, with the
same name or none, is the same thing exposed twice and gets no mark. Each number goes at a
corner of its box where it covers no number drawn before it and, where there is room, not its
own box (whose text stays readable), then as little of the other boxes as it can; inside its
box only when no corner outside is free.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .a11y import clean

INTERACTIVE = frozenset({
    "push-button", "toggle-button", "entry", "text", "password-text", "list-item", "check-box",
    "radio-button", "spin-button", "combo-box", "menu-item", "menu", "page-tab", "link", "table", "table-cell",
    "slider", "tree-item", "icon",
})
"""Tags (AT-SPI role names) that a click or typing can act on."""

_RED = (230, 20, 20)
SAME_BOX = 0.6
"""Intersection over union above which two marks with agreeing names are one element."""

Rect = tuple[int, int, int, int]
"""(left, top, right, bottom), right and bottom exclusive."""


def rect(row: dict) -> Rect:
    """A row's box as a Rect."""
    return row["x"], row["y"], row["x"] + row["w"], row["y"] + row["h"]


def overlap(a: Rect, b: Rect) -> int:
    """The area two Rects share."""
    return max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))


def duplicate(a: dict, b: dict) -> bool:
    """Whether two rows are one on-screen element: nearly the same box, and the same name or
    one of them unnamed (a menu title and its label, a combo box and its editable part)."""
    if a["name"] and b["name"] and a["name"] != b["name"]:
        return False
    shared = overlap(rect(a), rect(b))
    return shared > SAME_BOX * (a["w"] * a["h"] + b["w"] * b["h"] - shared)


def marks_of(rows: list[dict]) -> list[dict]:
    """The interactive rows that are visible (non-empty box), in tree order, each on-screen
    element once (its first row): mark i+1 is the i-th of them."""
    marks: list[dict] = []
    for r in rows:
        if r["tag"] in INTERACTIVE and r["w"] > 0 and r["h"] > 0 and not any(duplicate(m, r) for m in marks):
            marks.append(r)
    return marks


def centre(row: dict) -> tuple[int, int]:
    """The centre of a row's box (what an action on its mark clicks)."""
    return row["x"] + row["w"] // 2, row["y"] + row["h"] // 2


def same_element(a: dict, b: dict) -> bool:
    """Whether two rows are the same element in the same place (text may have changed)."""
    return all(a[k] == b[k] for k in ("tag", "name", "x", "y", "w", "h"))


def _candidates(box: Rect, size: tuple[int, int], screen: tuple[int, int]) -> list[Rect]:
    """Where a label of `size` may go, best first: outside the box at a corner (above, below,
    beside), then inside its top corners; each moved onto the screen."""
    (x0, y0, x1, y1), (w, h) = box, size
    corners = [(x0, y0 - h), (x1 - w, y0 - h), (x0, y1), (x1 - w, y1), (x0 - w, y0), (x1, y0),
               (x1 - w, y0), (x0, y0)]
    on_screen = [(min(max(x, 0), screen[0] - w), min(max(y, 0), screen[1] - h)) for x, y in corners]
    return [(x, y, x + w, y + h) for x, y in on_screen]


def _touching(rects: np.ndarray, area: Rect) -> np.ndarray:
    """The indices of the (n, 4) array's Rects that overlap `area`."""
    return np.flatnonzero((rects[:, 0] < area[2]) & (rects[:, 2] > area[0])
                          & (rects[:, 1] < area[3]) & (rects[:, 3] > area[1]))


def place_labels(boxes: list[Rect], sizes: list[tuple[int, int]], screen: tuple[int, int]) -> list[Rect]:
    """A label Rect per box, in order: each where it covers, in this order of importance, the
    fewest pixels of labels already placed, of its own box, and of the other boxes."""
    all_boxes, placed = np.array(boxes, dtype=np.int64).reshape(-1, 4), np.zeros((len(boxes), 4), np.int64)
    for i, (box, size) in enumerate(zip(boxes, sizes, strict=True)):
        candidates = _candidates(box, size, screen)
        reach = (min(c[0] for c in candidates), min(c[1] for c in candidates),
                 max(c[2] for c in candidates), max(c[3] for c in candidates))
        # only what lies within the candidates' reach can cost anything (600 marks: ms, not 6 s)
        labels = [tuple(placed[j]) for j in _touching(placed[:i], reach)]
        others = [boxes[j] for j in _touching(all_boxes, reach) if j != i]

        def cost(label: Rect, box: Rect = box, labels: list[tuple] = labels, others: list[Rect] = others) -> tuple:
            return (sum(overlap(label, p) for p in labels), overlap(label, box), sum(overlap(label, b) for b in others))
        placed[i] = min(candidates, key=cost)  # min keeps the first of equals
    return [(int(x0), int(y0), int(x1), int(y1)) for x0, y0, x1, y1 in placed]


def label_rects(marks: list[dict], screen: tuple[int, int]) -> list[Rect]:
    """Where `draw` puts each mark's number on a screen of (width, height)."""
    pen, font = ImageDraw.Draw(Image.new("RGB", (1, 1))), ImageFont.load_default()
    inks = [pen.textbbox((0, 0), str(i), font=font) for i in range(1, len(marks) + 1)]
    sizes = [(right - left + 2, bottom - top + 2) for left, top, right, bottom in inks]  # 1 px of red around
    return place_labels([rect(m) for m in marks], sizes, screen)


def draw(screenshot: np.ndarray, marks: list[dict]) -> np.ndarray:
    """A copy of the (H, W, 3) screenshot with each mark's box outlined and numbered."""
    image = Image.fromarray(screenshot)
    pen = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    for x0, y0, x1, y1 in map(rect, marks):  # every outline first: none may cross a number
        pen.rectangle((x0, y0, x1 - 1, y1 - 1), outline=_RED, width=2)
    for i, (x0, y0, x1, y1) in enumerate(label_rects(marks, image.size), start=1):
        left, top, _, _ = pen.textbbox((0, 0), str(i), font=font)
        pen.rectangle((x0, y0, x1 - 1, y1 - 1), fill=_RED)
        pen.text((x0 + 1 - left, y0 + 1 - top), str(i), fill=(255, 255, 255), font=font)
    return np.asarray(image, dtype=np.uint8).copy()


def table(marks: list[dict]) -> str:
    """The marks as a tab-separated table, one row per mark."""
    lines = ["mark\ttag\tname\ttext\tposition\tsize"]
    for i, m in enumerate(marks, start=1):
        fields = [" ".join(str(m[k]).split())[:200] for k in ("tag", "name", "text")]
        lines.append("\t".join([str(i), *fields, f"({m['x']}, {m['y']})", f"({m['w']}, {m['h']})"]))
    return clean("\n".join(lines))
