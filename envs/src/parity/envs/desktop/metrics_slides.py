"""OSWorld's metrics on presentations (.pptx, read with python-pptx) and on LibreOffice's
registry file (`registrymodifications.xcu`, where Impress and Writer keep their settings).

A metric is `func(result, expected_or_rules, **options) -> float`; a missing or unreadable
file scores 0. Names: compare_pptx_files, check_transition, check_slide_orientation_Portrait,
evaluate_presentation_fill_to_rgb_distance, check_image_stretch_and_center,
check_page_number_colors, check_presenter_console_disable, check_auto_saving_time,
find_default_font.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable
from typing import Any

from pptx import Presentation
from pptx.enum.dml import MSO_FILL
from pptx.enum.shapes import MSO_SHAPE_TYPE
from pptx.exc import PackageNotFoundError
from pptx.util import Inches

from .metrics import _read

_A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
_P = "{http://schemas.openxmlformats.org/presentationml/2006/main}"
_OOR = "{http://openoffice.org/2001/registry}"


def _pptx(path: Any) -> Any:
    """The presentation, or None (no path, not a .pptx)."""
    try:
        return _read(Presentation, path)
    except (PackageNotFoundError, ET.ParseError):
        return None


def _solid_rgb(fill: Any) -> Any:
    """A solid fill's RGB colour, else None (no fill, gradient, picture, theme colour)."""
    try:
        return fill.fore_color.rgb if fill.type == MSO_FILL.SOLID else None
    except (AttributeError, TypeError):
        return None


def _bullets(paragraph: Any) -> tuple[Any, Any, Any]:
    """A paragraph's list level, bullet character and bullet colour as written in its XML."""
    ppr = paragraph._p.find(f"{_A}pPr")
    if ppr is None:
        return None, None, None
    char, colour = ppr.find(f"{_A}buChar"), ppr.find(f"{_A}buClr/{_A}srgbClr")
    return ppr.get("lvl"), None if char is None else char.get("char"), None if colour is None else colour.get("val")


def _box(shape: Any) -> tuple[int, int, int, int]:
    return shape.left, shape.top, shape.width, shape.height


def _geometry_ok(s1: Any, s2: Any, slide_no: int, o: dict) -> bool:
    """The shapes' position and size agree as the options ask. OSWorld's special options: a
    picture's size only (examine_image_size), a shape without text's height only
    (examine_modify_height), a text box with unchanged text may move (examine_shape_for_shift_size),
    and a shape the task moves must have moved: the title down (examine_title_bottom_position),
    the table on slide 3 down (examine_table_bottom_position), the picture on slide 2 up
    (examine_top_position), the shape without text on slide 2 right (examine_right_position)."""
    same = _box(s1) == _box(s2)
    text1, text2 = getattr(s1, "text", None), getattr(s2, "text", None)
    picture = s1.shape_type == s2.shape_type == MSO_SHAPE_TYPE.PICTURE
    if o.get("examine_image_size") and picture:
        return (s1.width, s1.height) == (s2.width, s2.height)
    if o.get("examine_modify_height") and text1 is None and text2 is None:
        return s1.height == s2.height
    if o.get("examine_shape_for_shift_size") and text1 is not None and text1 == text2:
        return True
    if o.get("examine_title_bottom_position") and text1 is not None and text1 == text2 and s1.is_placeholder \
            and "TITLE" in str(s1.placeholder_format.type):
        return s1.top > s2.top
    if o.get("examine_table_bottom_position") and slide_no == 3 and s1.has_table and s2.has_table:
        return s1.top > s2.top
    if o.get("examine_top_position") and slide_no == 2 and picture:
        return s1.top < s2.top
    if o.get("examine_right_position") and slide_no == 2 and text1 is None and text2 is None:
        return s1.left > s2.left
    return same or not o.get("examine_shape", True)


def _runs_ok(p1: Any, p2: Any, o: dict) -> bool:
    for r1, r2 in zip(p1.runs, p2.runs, strict=False):
        f1, f2 = r1.font, r2.font
        checks = [("examine_font_name", f1.name, f2.name), ("examine_font_size", f1.size, f2.size),
                  ("examine_font_bold", f1.bold, f2.bold), ("examine_font_italic", f1.italic, f2.italic),
                  ("examine_font_underline", f1.underline, f2.underline),
                  ("examine_strike_through", f1._rPr.get("strike", "noStrike") if f1._rPr is not None else "noStrike",
                   f2._rPr.get("strike", "noStrike") if f2._rPr is not None else "noStrike")]
        rgb1, rgb2 = (getattr(f.color, "rgb", None) if f.color.type is not None else None for f in (f1, f2))
        if rgb1 is not None and rgb2 is not None:
            checks.append(("examine_color_rgb", rgb1, rgb2))
        if any(o.get(option, True) and a != b for option, a, b in checks):
            return False
    return True


def _text_ok(s1: Any, s2: Any, o: dict) -> bool:
    """Text, paragraph alignment, list level, bullets and run fonts agree as the options ask."""
    if not (s1.has_text_frame and s2.has_text_frame):
        return True
    if o.get("examine_text", True) and s1.text.strip() != s2.text.strip():
        return False
    for p1, p2 in zip(s1.text_frame.paragraphs, s2.text_frame.paragraphs, strict=False):
        checks = [("examine_alignment", p1.alignment, p2.alignment), ("examine_text", p1.text, p2.text),
                  ("examine_indent", p1.level, p2.level), ("examine_bullets", _bullets(p1), _bullets(p2))]
        if any(o.get(option, True) and a != b for option, a, b in checks) or not _runs_ok(p1, p2, o):
            return False
    return True


def _notes(slide: Any) -> str:
    return slide.notes_slide.notes_text_frame.text.strip() if slide.has_notes_slide else ""


def compare_pptx_files(file1: Any, file2: Any, **options: Any) -> float:
    """The result presentation matches the expected one: slide count, each slide's solid
    background colour and notes, and shape by shape their geometry and text as the options
    (OSWorld's `examine_*`, all true by default but the special geometry ones) ask."""
    prs1, prs2 = _pptx(file1), _pptx(file2)
    if prs1 is None or prs2 is None:
        return 0.0
    if options.get("examine_number_of_slides", True) and len(prs1.slides) != len(prs2.slides):
        return 0.0
    for no, (sl1, sl2) in enumerate(zip(prs1.slides, prs2.slides, strict=False), start=1):
        if options.get("examine_background_color", True) and \
                _solid_rgb(sl1.background.fill) != _solid_rgb(sl2.background.fill):
            return 0.0
        if options.get("examine_note", True) and _notes(sl1) != _notes(sl2):
            return 0.0
        for s1, s2 in zip(sl1.shapes, sl2.shapes, strict=False):
            if not (_geometry_ok(s1, s2, no, options) and _text_ok(s1, s2, options)):
                return 0.0
    return 1.0


def _slide_xml(path: Any, name: str) -> Any:
    """The root element of one part of a .pptx (None if it is not there)."""
    def load(p: str) -> Any:
        with zipfile.ZipFile(p) as z:
            return ET.fromstring(z.read(name)) if name in z.namelist() else None

    try:
        return _read(load, path)
    except ET.ParseError:
        return None


def check_transition(pptx_file: Any, rules: dict) -> float:
    """Slide `slide_idx` (from 0) has a transition of type `transition_type` (e.g. "dissolve")."""
    root = _slide_xml(pptx_file, f"ppt/slides/slide{rules['slide_idx'] + 1}.xml")
    transition = None if root is None else root.find(f".//{_P}transition")
    return float(transition is not None and transition.find(f".//{_P}{rules['transition_type']}") is not None)


def check_slide_orientation_Portrait(pptx_file: Any) -> float:  # OSWorld's name
    """The slides are taller than wide."""
    prs = _pptx(pptx_file)
    return float(prs is not None and prs.slide_width < prs.slide_height)


def evaluate_presentation_fill_to_rgb_distance(pptx_file: Any, rules: dict) -> float:
    """1 minus the mean distance (0..1, in RGB space) of each slide's background colour to
    rules["rgb"]; a slide that inherits its master's background is judged by the master's, a
    background that is not one solid colour is as far as it gets."""
    prs = _pptx(pptx_file)
    if prs is None or not prs.slides:
        return 0.0

    def distance(slide: Any) -> float:
        rgb = _solid_rgb(slide.background.fill) if slide.background.fill.type != MSO_FILL.BACKGROUND \
            else _solid_rgb(slide.slide_layout.slide_master.background.fill)
        if rgb is None:
            return 1.0
        return math.dist(tuple(rgb), rules["rgb"]) / math.dist((0, 0, 0), (255, 255, 255))

    return 1.0 - sum(map(distance, prs.slides)) / len(prs.slides)


def check_image_stretch_and_center(modified: Any, original: Any) -> float:
    """The first slide's picture (found by its bytes) now fills the slide and is centred,
    within half an inch."""
    prs_m, prs_o = _pptx(modified), _pptx(original)
    if prs_m is None or prs_o is None or not prs_o.slides or not prs_m.slides:
        return 0.0
    pictures = [s for s in prs_o.slides[0].shapes if s.shape_type == MSO_SHAPE_TYPE.PICTURE]
    if not pictures:
        return 0.0
    blob = pictures[0].image.blob
    moved = [s for s in prs_m.slides[0].shapes if s.shape_type == MSO_SHAPE_TYPE.PICTURE and s.image.blob == blob]
    if not moved:
        return 0.0
    pic, w, h, tol = moved[-1], prs_o.slide_width, prs_o.slide_height, Inches(0.5)
    return float(abs(pic.width - w) <= tol and abs(pic.height - h) <= tol
                 and abs(pic.left - (w - pic.width) / 2) <= tol and abs(pic.top - (h - pic.height) / 2) <= tol)


def check_page_number_colors(pptx_file: Any, rules: dict) -> float:
    """The slide master's page-number colour (its last solid colour but one, where LibreOffice
    writes it) is rules["color"]: red, green or blue (that channel 50 above both others) or
    black (all three under 50)."""
    root = _slide_xml(pptx_file, "ppt/slideMasters/slideMaster1.xml")
    colours = [] if root is None else root.findall(f".//{_A}solidFill//{_A}srgbClr")
    if len(colours) < 2:
        return 0.0
    r, g, b = (int(colours[-2].get("val", "000000")[i:i + 2], 16) for i in (0, 2, 4))
    tests: dict[str, Callable[[], bool]] = {
        "red": lambda: r > g + 50 and r > b + 50, "green": lambda: g > r + 50 and g > b + 50,
        "blue": lambda: b > r + 50 and b > g + 50, "black": lambda: max(r, g, b) < 50}
    return float(tests.get(rules["color"], lambda: True)())


def _registry_value(path: Any, item_path: str, prop: str) -> str | None:
    """A setting's value in LibreOffice's registrymodifications.xcu (None if it is not set)."""
    root = _read(lambda p: ET.parse(p).getroot(), path) if isinstance(path, str) else None
    if root is None:
        return None
    value = None
    for item in root.iter("item"):
        if item.get(f"{_OOR}path") == item_path:
            for p in item.iter("prop"):
                if p.get(f"{_OOR}name") == prop and p.find("value") is not None:
                    value = p.find("value").text  # the last one written wins
    return value


def check_presenter_console_disable(config_file: Any) -> float:
    """Impress's presenter console is switched off (EnablePresenterScreen false)."""
    value = _registry_value(config_file, "/org.openoffice.Office.Impress/Misc/Start", "EnablePresenterScreen")
    return float(value is not None and value.lower() == "false")


def check_auto_saving_time(config_file: Any, rules: dict) -> float:
    """LibreOffice saves recovery information every rules["minutes"] minutes."""
    value = _registry_value(config_file, "/org.openoffice.Office.Common/Save/Document", "AutoSaveTimeIntervall")
    return float(value is not None and value.strip().isdigit() and int(value) == rules["minutes"])


def find_default_font(config_file: Any, rules: dict) -> float:
    """Writer's default font (Standard) is rules["font_name"]."""
    value = _registry_value(config_file, "/org.openoffice.Office.Writer/DefaultFont", "Standard")
    return float(value == rules["font_name"])


METRICS: dict[str, Callable[..., float]] = {
    f.__name__: f for f in (compare_pptx_files, check_transition, check_slide_orientation_Portrait,
                            evaluate_presentation_fill_to_rgb_distance, check_image_stretch_and_center,
                            check_page_number_colors, check_presenter_console_disable, check_auto_saving_time,
                            find_default_font)
}
