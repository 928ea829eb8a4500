"""OSWorld's vocabulary on the desktop: the loader's network refusals and translations, the
coverage command, and every getter and metric added for OSWorld's task set, each on small
files built here (no X server, no desktop: getters read from a fake client)."""

from __future__ import annotations

import base64
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import docx
import numpy as np
import openpyxl
import pytest
import typer
from docx.enum.text import WD_COLOR_INDEX
from docx.shared import Pt, RGBColor
from odf.opendocument import OpenDocumentText
from odf.style import Style, TextProperties
from odf.text import P, Span
from PIL import Image
from pptx import Presentation
from pptx.dml.color import RGBColor as PptxRGB
from pptx.util import Inches
from typer.testing import CliRunner

from parity.envs.cli import app
from parity.envs.desktop import getters_apps
from parity.envs.desktop.getters import EvalContext
from parity.envs.desktop.steps import osworld_step, setup_steps
from parity.envs.desktop.tasks import TaskError, load_task
from parity.envs.desktop.vocabulary import GETTERS, METRICS

URL = "https://example.invalid/files/report.pdf"
GOOD = {"id": "t", "instruction": "do it", "config": [],
        "evaluator": {"func": "check_list", "result": {"type": "vm_file", "path": "/home/user/a.txt", "dest": "a.txt"},
                      "expected": {"type": "rule", "rules": {"expect": ["x"]}}}}


def _task(tmp_path: Path, doc: dict, name: str = "task.json") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


# --- the loader -----------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "field", "needs"), [
    ({"config": [{"type": "login", "parameters": {"platform": "googledrive"}}]}, "config[0].type", "a login"),
    ({"config": [{"type": "googledrive", "parameters": {}}]}, "config[0].type", "Google Drive"),
    ({"config": [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["file:///a.html", "https://a.invalid"]}}]},
     "config[0].parameters.urls_to_open[1]", "the internet"),
    ({"config": [{"type": "launch", "parameters": {"command": ["google-chrome", "http://a.invalid/"]}}]},
     "config[0].parameters", "the internet"),
    ({"evaluator": {**GOOD["evaluator"], "result": {"type": "googledrive_file", "path": ["x"]}}},
     "evaluator.result getter 'googledrive_file'", "Google Drive"),
])
def test_tasks_that_need_a_network_are_refused_with_the_reason(tmp_path: Path, change: dict, field: str,
                                                               needs: str) -> None:
    path = _task(tmp_path, {**GOOD, **change})
    with pytest.raises(TaskError) as err:
        load_task(path)
    assert str(err.value) == f"{path}: {field} needs {needs}, which the desktop does not have"
    assert err.value.reason.startswith(f"needs {needs} (")


@pytest.mark.parametrize(("change", "message"), [
    ({"evaluator": {**GOOD["evaluator"], "func": "compare_holograms"}}, "evaluator.func 'compare_holograms' is not"),
    ({"evaluator": {**GOOD["evaluator"], "result": {"type": "crystal_ball"}}}, "evaluator.result has unknown getter"),
    ({"evaluator": {**GOOD["evaluator"], "func": ""}}, "evaluator.func is empty"),
    ({"config": [{"type": "chrome_close_tabs", "parameters": {}}]}, "config[0].type must be one of"),
])
def test_unknown_names_are_refused_naming_the_file_and_field(tmp_path: Path, change: dict, message: str) -> None:
    path = _task(tmp_path, {**GOOD, **change})
    with pytest.raises(TaskError) as err:
        load_task(path)
    assert str(err.value).startswith(f"{path}: {message}")


def test_osworld_setup_steps_are_translated(tmp_path: Path) -> None:
    doc = {**GOOD, "config": [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["file:///home/user/a.html"]}}]}
    assert load_task(_task(tmp_path, {k: v for k, v in GOOD.items() if k != "config"})).config == []
    assert load_task(_task(tmp_path, doc)).config[0]["type"] == "chrome_open_tabs"
    assert osworld_step(doc["config"][0]) == {"type": "launch",
                                              "parameters": {"command": ["chromium", "file:///home/user/a.html"]}}
    assert osworld_step({"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}}) \
        == {"type": "launch", "parameters": {"command": ["chromium", "--remote-debugging-port=1337"]}}
    assert osworld_step({"type": "launch", "parameters": {"command": ["pkill", "chrome"]}})["parameters"]["command"] \
        == ["pkill", "chromium"]
    assert osworld_step({"type": "launch", "parameters": {"command": ["nautilus", "/tmp"]}})["parameters"]["command"] \
        == ["pcmanfm", "/tmp"]
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "report.pdf").write_bytes(b"%PDF")
    steps = [{"type": "download", "parameters": {"files": [{"url": URL, "path": "/home/user/r.pdf"}]}},
             {"type": "sleep", "parameters": {"seconds": 1}}]
    assert setup_steps(steps, tmp_path / "files") == [
        {"type": "write_file", "parameters": {"path": "/home/user/r.pdf", "content_base64": base64.b64encode(b"%PDF").decode()}},
        {"type": "sleep", "parameters": {"seconds": 1}}]


def test_osworld_coverage_command_counts_per_app_and_ranks_reasons(tmp_path: Path) -> None:
    download = {"type": "download", "parameters": {"files": [{"url": URL, "path": "/home/user/r.pdf"}]}}
    _task(tmp_path, {**GOOD, "config": [download]}, "calc/a.json")  # loads: its download is a placeholder
    _task(tmp_path, {**GOOD, "config": [{"type": "login", "parameters": {}}]}, "calc/b.json")
    _task(tmp_path, {**GOOD, "evaluator": {**GOOD["evaluator"], "func": "compare_holograms"}}, "vlc/c.json")
    _task(tmp_path, {**GOOD, "evaluator": {**GOOD["evaluator"], "func": "compare_holograms"}}, "vlc/d.json")
    _task(tmp_path, GOOD, "Windows/e.json")
    result = CliRunner().invoke(app, ["osworld-coverage", str(tmp_path), "--exclude", "Windows", "--json"])
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    assert r["apps"]["calc"] == {"tasks": 2, "accepted": 1, "needs_network": 1, "share": 0.5, "offline_share": 1.0,
                                 "refusals": [["needs a login (login)", 1]]}
    assert r["apps"]["vlc"]["refusals"] == [["metric 'compare_holograms' is not implemented", 2]]
    assert (r["all"]["tasks"], r["all"]["accepted"], r["all"]["offline_share"]) == (4, 1, 1 / 3)
    text = CliRunner().invoke(app, ["osworld-coverage", str(tmp_path), "--exclude", "Windows"]).output
    assert "calc" in text and "1/2" in text and "needs a login (login) ×1" in text
    assert CliRunner().invoke(app, ["osworld-coverage", str(tmp_path / "nope")]).exit_code == 2


def test_bench_desktop_refuses_an_unknown_backend_in_one_line() -> None:
    from parity.envs.desktop.cli import bench_desktop

    bench = typer.Typer()
    bench.command()(bench_desktop)
    result = CliRunner().invoke(bench, ["--backend", "nope"])
    assert result.exit_code == 2
    assert result.output == "parity bench desktop: --backend must be local or docker, not 'nope'\n"


# --- presentations and LibreOffice's settings ----------------------------------------------

def _pptx(path: Path, text: str = "Title", bg: tuple[int, int, int] | None = None, portrait: bool = False,
          picture: tuple[int, int, int, int] | None = None) -> str:
    prs = Presentation()
    if portrait:
        prs.slide_width, prs.slide_height = prs.slide_height, prs.slide_width
    slide = prs.slides.add_slide(prs.slide_layouts[5])
    slide.shapes.title.text = text
    if bg is not None:
        slide.background.fill.solid()
        slide.background.fill.fore_color.rgb = PptxRGB(*bg)
    if picture is not None:
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (9, 9, 9)).save(buf, "PNG")
        slide.shapes.add_picture(io.BytesIO(buf.getvalue()), *picture)
    prs.save(path)
    return str(path)


def _zip(path: Path, parts: dict[str, str]) -> str:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in parts.items():
            z.writestr(name, text)
    return str(path)


P_NS = 'xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"'
A_NS = 'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"'
R_NS = 'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"'


def test_slide_metrics(tmp_path: Path) -> None:
    a, b, c = (_pptx(tmp_path / f"{n}.pptx", t) for n, t in (("a", "Title"), ("b", "Title"), ("c", "Other")))
    assert METRICS["compare_pptx_files"](a, b) == 1.0 and METRICS["compare_pptx_files"](a, c) == 0.0
    assert METRICS["compare_pptx_files"](a, c, examine_text=False) == 1.0
    assert METRICS["compare_pptx_files"](None, a) == 0.0
    red = _pptx(tmp_path / "red.pptx", bg=(255, 0, 0))
    assert METRICS["compare_pptx_files"](red, a) == 0.0
    assert METRICS["evaluate_presentation_fill_to_rgb_distance"](red, {"rgb": [255, 0, 0]}) == 1.0
    assert METRICS["evaluate_presentation_fill_to_rgb_distance"](a, {"rgb": [255, 0, 0]}) == 0.0
    assert METRICS["check_slide_orientation_Portrait"](_pptx(tmp_path / "p.pptx", portrait=True)) == 1.0
    assert METRICS["check_slide_orientation_Portrait"](a) == 0.0
    small = _pptx(tmp_path / "s.pptx", picture=(Inches(1), Inches(1), Inches(2), Inches(2)))
    full = _pptx(tmp_path / "f.pptx", picture=(0, 0, Inches(10), Inches(7.5)))
    assert METRICS["check_image_stretch_and_center"](full, small) == 1.0
    assert METRICS["check_image_stretch_and_center"](small, small) == 0.0
    slide = f'<p:sld {P_NS}><p:transition><p:dissolve/></p:transition></p:sld>'
    trans = _zip(tmp_path / "t.pptx", {"ppt/slides/slide1.xml": slide})
    assert METRICS["check_transition"](trans, {"slide_idx": 0, "transition_type": "dissolve"}) == 1.0
    assert METRICS["check_transition"](trans, {"slide_idx": 0, "transition_type": "fade"}) == 0.0
    master = (f'<p:sldMaster {P_NS} {A_NS}><a:solidFill><a:srgbClr val="FF0000"/></a:solidFill>'
              '<a:solidFill><a:srgbClr val="000000"/></a:solidFill></p:sldMaster>')
    colours = _zip(tmp_path / "m.pptx", {"ppt/slideMasters/slideMaster1.xml": master})
    assert METRICS["check_page_number_colors"](colours, {"color": "red"}) == 1.0
    assert METRICS["check_page_number_colors"](colours, {"color": "blue"}) == 0.0


def _xcu(path: Path, item: str, prop: str, value: str) -> str:
    path.write_text('<?xml version="1.0"?><oor:items xmlns:oor="http://openoffice.org/2001/registry">'
                    f'<item oor:path="{item}"><prop oor:name="{prop}" oor:op="fuse"><value>{value}</value></prop>'
                    '</item></oor:items>')
    return str(path)


def test_libreoffice_settings_metrics(tmp_path: Path) -> None:
    off = _xcu(tmp_path / "1.xcu", "/org.openoffice.Office.Impress/Misc/Start", "EnablePresenterScreen", "false")
    on = _xcu(tmp_path / "2.xcu", "/org.openoffice.Office.Impress/Misc/Start", "EnablePresenterScreen", "true")
    assert METRICS["check_presenter_console_disable"](off) == 1.0 and METRICS["check_presenter_console_disable"](on) == 0.0
    save = _xcu(tmp_path / "3.xcu", "/org.openoffice.Office.Common/Save/Document", "AutoSaveTimeIntervall", "3")
    assert METRICS["check_auto_saving_time"](save, {"minutes": 3}) == 1.0
    assert METRICS["check_auto_saving_time"](save, {"minutes": 10}) == 0.0
    font = _xcu(tmp_path / "4.xcu", "/org.openoffice.Office.Writer/DefaultFont", "Standard", "Times New Roman")
    assert METRICS["find_default_font"](font, {"font_name": "Times New Roman"}) == 1.0
    assert METRICS["find_default_font"](font, {"font_name": "Arial"}) == 0.0


# --- documents ------------------------------------------------------------------------------

def _docx(path: Path, *paras: str, table: list[list[str]] | None = None, spacing: float | None = None,
          style: dict | None = None, picture: bool = False, equation: bool = False, footer: str = "") -> str:
    d = docx.Document()
    for text in paras:
        p = d.add_paragraph()
        run = p.add_run(text)
        for k, v in (style or {}).items():
            setattr(run.font, k, v)
        if spacing is not None:
            p.paragraph_format.line_spacing = spacing
        if equation:
            run._r.append(run._r.makeelement("{http://schemas.openxmlformats.org/wordprocessingml/2006/main}object", {}))
    if table:
        t = d.add_table(rows=len(table), cols=len(table[0]))
        for i, row in enumerate(table):
            for j, text in enumerate(row):
                t.cell(i, j).text = text
    if picture:
        buf = io.BytesIO()
        Image.new("RGB", (4, 4), (200, 0, 0)).save(buf, "PNG")
        d.add_paragraph().add_run().add_picture(buf)
    if footer:
        d.sections[0].footer.paragraphs[0].text = footer
    d.save(path)
    return str(path)


def test_document_metrics(tmp_path: Path) -> None:
    def doc(name: str, *paras: str, **kw: Any) -> str:
        return _docx(tmp_path / f"{name}.docx", *paras, **kw)

    t1, t2 = doc("t1", "x", table=[["a", "b"]]), doc("t2", "x", table=[["a", "c"]])
    assert METRICS["compare_docx_tables"](t1, doc("t1b", "x", table=[["a", "b"]])) == 1.0
    assert METRICS["compare_docx_tables"](t1, t2) == 0.0
    s1, s2 = doc("s1", "a", "b", spacing=2.0), doc("s2", "a", "b", spacing=1.0)
    assert METRICS["compare_line_spacing"](s1, doc("s1b", "a", "b", spacing=2.0)) == 1.0
    assert METRICS["compare_line_spacing"](s1, s2) == 0.0
    n1, n2 = doc("n1", "a", "", "b"), doc("n2", "a", "b")
    assert METRICS["compare_docx_files_and_ignore_new_lines"](n1, n2, ignore_blanks=False) == 1.0
    assert METRICS["compare_docx_files_and_ignore_new_lines"](n1, doc("n3", "a", "c")) == 0.0
    assert METRICS["compare_docx_lines"](doc("l1", "b", "a"), n2) == 1.0
    assert METRICS["compare_docx_lines"](doc("l2", "b"), n2) == 0.0
    assert METRICS["compare_subscript_contains"](doc("u1", "H2O", style={"subscript": True}),
                                                 doc("u2", "H2O", style={"subscript": True})) == 1.0
    assert METRICS["compare_subscript_contains"](n2, n2) == 0.0
    e1 = doc("e1", "x", equation=True)
    assert METRICS["compare_insert_equation"](e1, doc("e2", "x", equation=True)) == 1.0
    assert METRICS["compare_insert_equation"](doc("e3", "x"), doc("e4", "x")) == 0.0
    i1, i2 = doc("i1", "x", picture=True), doc("i2", "x", picture=True)
    assert METRICS["compare_contains_image"](i1, i2) == 1.0 and METRICS["compare_contains_image"](i1, n2) == 0.0
    assert METRICS["compare_docx_images"](i1, i2) == 1.0 and METRICS["compare_docx_images"](i1, n2) == 0.0
    assert METRICS["compare_font_names"](doc("f1", "a", style={"name": "Arial"}), {"font_name": "Arial"}) == 1.0
    assert METRICS["compare_font_names"](doc("f2", "a", style={"name": "Calibri"}), {"font_name": "Arial"}) == 0.0
    assert METRICS["has_page_numbers_in_footers"](doc("p1", "a", footer="Page 1")) == 1.0
    assert METRICS["has_page_numbers_in_footers"](doc("p2", "a", footer="Page")) == 0.0
    yellow = {"highlight_color": WD_COLOR_INDEX.YELLOW}
    h1 = doc("h1", "key", style=yellow)
    assert METRICS["compare_highlighted_text"](h1, doc("h2", "key", style=yellow)) == 1.0
    assert METRICS["compare_highlighted_text"](h1, doc("h3", "key")) == 0.0
    strike = doc("k1", "a", "gone", style={"strike": True})
    assert METRICS["evaluate_strike_through_last_paragraph"](strike, doc("k2", "a", "gone")) == 1.0
    assert METRICS["evaluate_strike_through_last_paragraph"](doc("k3", "a", "gone"), strike) == 0.0
    big = doc("b1", "a", style={"italic": True, "size": Pt(14)})
    assert METRICS["check_italic_font_size_14"](big, doc("b2", "a")) == 1.0
    assert METRICS["check_italic_font_size_14"](doc("b3", "a", style={"italic": True, "size": Pt(12)}), big) == 0.0
    refs = doc("r1", "Body", "References", "Smith 2020. A title.")
    assert METRICS["compare_references"](refs, doc("r2", "Body", "References", "Smith 2020. A title.")) == 1.0
    assert METRICS["compare_references"](refs, n2) == 0.0


def test_document_metrics_on_tables_tabs_and_odt(tmp_path: Path) -> None:
    d = docx.Document()
    cell = d.add_table(rows=1, cols=2).rows[0].cells
    for c, word, rgb in ((cell[0], "apple", (255, 0, 0)), (cell[1], "pear", (0, 0, 255))):
        c.paragraphs[0].add_run(word).font.color.rgb = RGBColor(*rgb)
    d.save(tmp_path / "c.docx")
    cell[1].paragraphs[0].runs[0].font.color.rgb = RGBColor(255, 0, 0)
    d.save(tmp_path / "c2.docx")
    assert METRICS["evaluate_colored_words_in_tables"](str(tmp_path / "c.docx"), str(tmp_path / "c.docx")) == 1.0
    assert METRICS["evaluate_colored_words_in_tables"](str(tmp_path / "c2.docx"), str(tmp_path / "c2.docx")) == 0.0

    def tabs(name: str, at: float | None) -> str:
        doc = docx.Document()
        p = doc.add_paragraph("one two\tthree")
        if at is not None:
            p.paragraph_format.tab_stops.add_tab_stop(Pt(at))
        doc.save(tmp_path / name)
        return str(tmp_path / name)

    assert METRICS["check_tabstops"](tabs("t1.docx", 72), tabs("t2.docx", 72), word_number_split_by_tabstop=2) == 1.0
    assert METRICS["check_tabstops"](tabs("t3.docx", None), tabs("t4.docx", 72)) == 0.0

    def odt(name: str, highlighted: bool) -> str:
        text = OpenDocumentText()
        style = Style(name="Mark", family="text")
        style.addElement(TextProperties(backgroundcolor="#ffff00"))
        text.automaticstyles.addElement(style)
        p = P()
        p.addElement(Span(stylename="Mark", text="word") if highlighted else Span(text="word"))
        text.text.addElement(p)
        text.save(str(tmp_path / name))
        return str(tmp_path / name)

    assert METRICS["check_highlighted_words"](odt("a.odt", False), odt("b.odt", True)) == 1.0
    assert METRICS["check_highlighted_words"](odt("c.odt", True), odt("d.odt", True)) == 0.0


# --- images ---------------------------------------------------------------------------------

def _png(path: Path, pixels: np.ndarray, mode: str | None = None) -> str:
    img = Image.fromarray(pixels.astype(np.uint8))
    (img.convert(mode) if mode else img).save(path)
    return str(path)


def test_image_metrics(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base = rng.integers(40, 200, (32, 48, 3))
    a, same, noise = (_png(tmp_path / f"{n}.png", p) for n, p in
                      (("a", base), ("same", base), ("noise", rng.integers(0, 256, (32, 48, 3)))))
    assert METRICS["compare_images"](a, same) == 1.0 and METRICS["compare_images"](a, noise) < 0.2
    assert METRICS["check_structure_sim"](a, same) == 1.0 and METRICS["check_structure_sim"](a, noise) == 0.0
    big = _png(tmp_path / "big.png", np.kron(base, np.ones((2, 2, 1))))
    assert METRICS["check_structure_sim_resized"](big, a) == 1.0
    assert METRICS["check_structure_sim_resized"](noise, a) == 0.0
    assert METRICS["check_file_exists_and_structure_sim"](a, same) == 1.0
    assert METRICS["check_file_exists_and_structure_sim"](str(tmp_path / "none.png"), a) == 0.0
    dark = _png(tmp_path / "dark.png", base * 0.6)
    assert METRICS["check_brightness_decrease_and_structure_sim"](dark, a) == 1.0
    assert METRICS["check_brightness_decrease_and_structure_sim"](a, dark) == 0.0
    contrast = _png(tmp_path / "contrast.png", np.clip((base - 120) * 1.5 + 120, 0, 255))
    assert METRICS["check_contrast_increase_and_structure_sim"](contrast, a) == 1.0
    assert METRICS["check_contrast_increase_and_structure_sim"](a, contrast) == 0.0
    grey = base.mean(axis=2, keepdims=True)
    dull, vivid = (_png(tmp_path / f"{n}.png", np.clip(grey + (base - grey) * k, 0, 255)) for n, k in
                   (("dull", 0.5), ("vivid", 1.0)))
    assert METRICS["check_saturation_increase_and_structure_sim"](vivid, dull) == 1.0
    assert METRICS["check_saturation_increase_and_structure_sim"](dull, vivid) == 0.0
    pal = _png(tmp_path / "pal.png", np.repeat(np.repeat(base[::4, ::4], 4, 0), 4, 1), "P")
    Image.open(pal).convert("RGB").save(tmp_path / "pal-rgb.png")
    assert METRICS["check_palette_and_structure_sim"](pal, str(tmp_path / "pal-rgb.png")) == 1.0
    assert METRICS["check_palette_and_structure_sim"](a, a) == 0.0
    mirrored = _png(tmp_path / "m.png", base[:, ::-1])
    assert METRICS["check_image_mirror"](a, mirrored) == 1.0 and METRICS["check_image_mirror"](a, same) == 0.0
    mask = np.zeros((32, 48, 3))
    mask[:, 24:] = 255
    green = np.zeros((32, 48, 3))
    green[..., 1] = 200
    assert METRICS["check_green_background"](_png(tmp_path / "g.png", green), _png(tmp_path / "k.png", mask)) == 1.0
    assert METRICS["check_green_background"](a, str(tmp_path / "k.png")) == 0.0
    assert METRICS["check_image_size"](a, {"width": 48, "height": 32}) == 1.0
    assert METRICS["check_image_size"](a, {"width": 50}) == 0.0
    assert METRICS["check_image_file_size"](a, {"max_size": 10**6}) == 1.0
    assert METRICS["check_image_file_size"](a, {"max_size": 10}) == 0.0
    text = np.full((40, 100, 3), 255)
    text[10:20, 2:30] = 0
    assert METRICS["check_textbox_on_leftside"](_png(tmp_path / "l.png", text)) == 1.0
    assert METRICS["check_textbox_on_leftside"](_png(tmp_path / "r.png", text[:, ::-1])) == 0.0
    shape = np.full((40, 40, 3), 255)
    shape[17:23, 17:23] = (255, 0, 0)
    assert METRICS["check_triangle_position"](_png(tmp_path / "c.png", shape)) == 1.0
    assert METRICS["check_triangle_position"](_png(tmp_path / "o.png", np.roll(shape, 15, axis=1))) == 0.0
    assert METRICS["compare_image_list"]([a], [same]) == 1.0 and METRICS["compare_image_list"]([a], [noise]) == 0.0


# --- files, values and application settings -------------------------------------------------

def _pdf(path: Path, text: str) -> str:
    """A one-page PDF with one line of text (Helvetica), its cross-reference table exact."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path.write_bytes(bytes(out))
    return str(path)


def _file(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_pdf_and_archive_metrics(tmp_path: Path) -> None:
    a, b, c = _pdf(tmp_path / "a.pdf", "Hello world"), _pdf(tmp_path / "b.pdf", "Hello world"), \
        _pdf(tmp_path / "c.pdf", "QQQQ")
    assert METRICS["compare_pdfs"](a, b) == 1.0 and METRICS["compare_pdfs"](a, c) == 0.0
    assert METRICS["compare_pdfs"]([a], [b]) == 1.0
    assert METRICS["check_pdf_pages"](a, {"relation": "eq", "ref_value": 1}) == 1.0
    assert METRICS["check_pdf_pages"](a, {"relation": "gt", "ref_value": 1}) == 0.0
    pa = _zip(tmp_path / "pa.zip", {"d/x.txt": "one", "d/y.txt": "two"})
    pb = _zip(tmp_path / "pb.zip", {"d/x.txt": "one", "d/y.txt": "two"})
    pc = _zip(tmp_path / "pc.zip", {"d/x.txt": "one", "d/y.txt": "TWO"})
    assert METRICS["compare_archive"](pa, pb, file_path="d") == 1.0
    assert METRICS["compare_archive"](pa, pc, file_path="d") == 0.5
    assert METRICS["compare_zip_files"](pa, pb) == 1.0 and METRICS["compare_zip_files"](pa, pc) == 0.0


def test_text_and_value_metrics(tmp_path: Path) -> None:
    lst = _file(tmp_path / "l.txt", "alpha 1\nbeta 2\n")
    assert METRICS["check_list"](lst, {"expect": [r"^beta \d"], "unexpect": ["gamma"]}) == 1.0
    assert METRICS["check_list"](lst, {"expect": ["gamma"]}) == 0.0
    table = _file(tmp_path / "t.csv", "name,age\nann,3\nbob,4\n")
    assert METRICS["check_csv"](table, {"expect": [{"name": "bob", "age": "4"}], "unexpect": [{"name": "cy"}]}) == 1.0
    assert METRICS["check_csv"](table, {"expect": [{"name": "bob", "age": "5"}]}) == 0.0
    assert METRICS["file_contains"](lst, {"expected": ["alpha", "beta"]}) == 1.0
    assert METRICS["file_contains"](lst, {"expected": ["gamma"]}) == 0.0
    assert METRICS["diff_text_file"](lst, _file(tmp_path / "l2.txt", "alpha 1\nbeta 2")) == 1.0
    assert METRICS["diff_text_file"](lst, _file(tmp_path / "l3.txt", "x\ny\n")) == 0.0
    assert METRICS["compare_result_files"](_file(tmp_path / "r1", "The answer is 42\n"),
                                           _file(tmp_path / "r2", "42")) == 1.0
    assert METRICS["compare_result_files"](_file(tmp_path / "r3", "41.5"), str(tmp_path / "r2")) == 0.0
    assert METRICS["compare_config"](_file(tmp_path / "c", "a=1"), {"expected": "a=1"}) == 1.0
    assert METRICS["compare_config"](str(tmp_path / "c"), {"expected": "a=2"}) == 0.0
    keys = _file(tmp_path / "k.json", '// keybindings\n[{"key": "ctrl+j", "command": "x"}]')
    assert METRICS["check_json_keybindings"](keys, {"expected": {"key": "ctrl+j", "command": "x"}}) == 1.0
    assert METRICS["check_json_keybindings"](keys, {"expected": {"key": "ctrl+k", "command": "x"}}) == 0.0
    words = _docx(tmp_path / "w.docx", "pi e phi")
    assert METRICS["fuzzy_place_math"](words, {"expected": ["pi", "e", "phi"]}) == 1.0
    assert METRICS["fuzzy_place_math"](_docx(tmp_path / "w2.docx", "pi e"), {"expected": ["pi"]}) == 0.0
    book = openpyxl.Workbook()
    book.active["C2"], book.active["C3"] = "Vienna, Austria", "Lima"
    book.save(tmp_path / "cities.xlsx")
    cities = str(tmp_path / "cities.xlsx")
    assert METRICS["compare_conference_city_in_order"](cities, {"expected": ["Vienna", ["Lima", "Lim"]]}) == 1.0
    assert METRICS["compare_conference_city_in_order"](cities, {"expected": ["Lima", "Vienna"]}) == 0.0
    import sqlite3

    with sqlite3.connect(tmp_path / "db.sqlite") as db:
        db.execute("create table t (n int)")
        db.execute("insert into t values (1)")
    assert METRICS["run_sqlite3"](str(tmp_path / "db.sqlite"), {"sql": "select count(*) from t"}) == 1.0
    assert METRICS["run_sqlite3"](str(tmp_path / "db.sqlite"), {"sql": "select count(*) from t where n > 1"}) == 0.0
    assert METRICS["check_direct_json_object"]("{'a': 1, 'b': 'x'}", {"expected": {"a": 1}}) == 1.0
    assert METRICS["check_direct_json_object"]({"a": 2}, {"expected": {"a": 1}}) == 0.0
    assert METRICS["check_direct_json_object"]({"a": "xyz", "b": ["p"]},
                                               {"expected": {"a": "y", "b": ["q", "p"]}, "expect_in_result": True}) == 1.0
    assert METRICS["is_expected_url_pattern_match"]({"url": "https://a.test/q?x=1"}, {"expected": ["a\\.test", "x=1"]}) == 1.0
    assert METRICS["is_expected_url_pattern_match"]("https://a.test/", {"expected": ["x=1"]}) == 0.0
    assert METRICS["is_extension_installed"]("ms-python.python\n", {"type": "contain", "expected": "ms-python.python"}) == 1.0
    assert METRICS["is_extension_installed"]("ms-python.python\n", {"type": "not_contain", "expected": "ms-python"}) == 0.0
    assert METRICS["is_in_vm_clickboard"]({"expected": ["a", "b"]}, "a b") == 1.0
    assert METRICS["is_in_vm_clickboard"]({"expected": "c"}, "a b") == 0.0
    assert METRICS["is_utc_0"]("Local time: x\n Universal time: y\n RTC time: z\n Time zone: Etc/UTC (UTC, +0000)") == 1.0
    assert METRICS["is_utc_0"]("Time zone: Europe/Paris (CET, +0100)") == 0.0
    assert METRICS["check_text_enlarged"]("1.25\n") == 1.0 and METRICS["check_text_enlarged"]("1.0") == 0.0
    assert METRICS["check_gnome_favorite_apps"]("['b.desktop', 'a.desktop']", {"expected": ["a.desktop", "b.desktop"]}) == 1.0
    assert METRICS["check_gnome_favorite_apps"]("__import__('os')", {"expected": []}) == 0.0
    roots = {"bookmark_bar": {"children": [{"type": "folder", "name": "Liked Authors", "children": [
        {"type": "url", "url": "https://a.test/"}]}, {"type": "url", "url": "https://b.test/"}]}}
    assert METRICS["is_expected_bookmarks"](roots, {"type": "bookmark_bar_folders_names", "names": ["Liked Authors"]}) == 1.0
    assert METRICS["is_expected_bookmarks"](roots, {"type": "bookmark_bar_websites_urls", "urls": ["https://c.test/"]}) == 0.0
    assert METRICS["is_expected_bookmarks"](roots, {"type": "liked_authors_websites_urls",
                                                    "urls": [["https://x.test/", "https://a.test/"]]}) == 1.0


def test_application_settings_metrics(tmp_path: Path) -> None:
    prefs = _file(tmp_path / "prefs.js", 'user_pref("mail.spam.manualMark", true);\nuser_pref("a.b", 3);\n')
    assert METRICS["check_thunderbird_prefs"](prefs, {"expect": {"mail.spam.manualMark": {"method": "eq", "ref": True}},
                                                      "unexpect": {"a.b": {"method": "gt", "ref": 5}}}) == 1.0
    assert METRICS["check_thunderbird_prefs"](prefs, {"expect": {"a.b": {"method": "eq", "ref": 4}}}) == 0.0
    rules = _file(tmp_path / "msgFilterRules.dat",
                  'version="9"\nname="Spam"\nenabled="yes"\ntype="17"\naction="Move to folder"\n'
                  'actionValue="mailbox://nobody@Local%20Folders/Junk"\ncondition="AND (subject,contains,offer)"\n')
    want = {"name": "Spam", "enabled": "yes", "action": "Move to folder",
            "condition": ["AND (subject,contains,offer)"]}
    assert METRICS["check_thunderbird_filter"](rules, {"expect": [want]}) == 1.0
    assert METRICS["check_thunderbird_filter"](rules, {"expect": [{**want, "enabled": "no"}]}) == 0.0
    gimprc = _file(tmp_path / "gimprc", '# GIMP gimprc\n(undo-levels 100)\n(history-item "filters-vignette" 0 1)\n')
    assert METRICS["check_config_status"](gimprc, {"key": "undo-levels", "value": "100"}) == 1.0
    assert METRICS["check_config_status"](gimprc, {"key": ["history-item", '"filters-vignette"'], "value": "1"}) == 1.0
    assert METRICS["check_config_status"](gimprc, {"key": "undo-levels", "value": "5"}) == 0.0
    vlcrc = _file(tmp_path / "vlcrc", "[qt]\nqt-bgcone=0\n#qt-max-volume=125\nqt-minimal-view=1\n"
                                      "global-key-play-pause=Space\ninput-record-path=/home/user/rec\n"
                                      "qt-slider-colours=1;2;3;4;5;6;7;8;9;10;11;12\n")
    assert METRICS["check_qt_bgcone"](vlcrc, {"expected_qt_bgcone": 0}) == 1.0
    assert METRICS["check_qt_max_volume"](vlcrc, {"expected_qt_max_volume": 200}) == 0.0
    assert METRICS["check_qt_max_volume"](vlcrc, {"expected_qt_max_volume": "125"}) == 1.0
    assert METRICS["check_qt_minimal_view"](vlcrc, {"expected_qt_minimal_view": 1}) == 1.0
    assert METRICS["check_one_instance_when_started_from_file"](vlcrc, {
        "expected_one_instance_when_started_from_file": 0}) == 0.0
    assert METRICS["is_vlc_recordings_folder"](vlcrc, {"recording_file_path": "/home/user/rec"}) == 1.0
    assert METRICS["check_global_key_play_pause"](vlcrc, {"expected_global_key_play_pause": 1}) == 1.0
    assert METRICS["check_global_key_play_pause"](vlcrc, {"expected_global_key_play_pause": 0}) == 0.0
    assert METRICS["check_qt_slider_colours"](vlcrc, {"type": "blackish"}) == 1.0
    assert METRICS["check_qt_slider_colours"](vlcrc, {"type": "match", "expected_qt_slider_colours": "0"}) == 0.0


# --- getters --------------------------------------------------------------------------------

class FakeDesktop:
    """Answers the client calls getters make, from a dict of guest paths to bytes."""

    def __init__(self, files: dict[str, bytes], stdout: dict[str, str] | None = None) -> None:
        self.files, self.stdout, self.ops = files, stdout or {}, []

    def file(self, path: str, binary: bool = False) -> dict:
        data = self.files.get(path)
        if data is None:
            return {"exists": False, "is_dir": False, "content": None, "entries": None}
        return {"exists": True, "is_dir": False, "content": data.decode(errors="replace"),
                "content_base64": base64.b64encode(data).decode(), "entries": None}

    def setup(self, step: dict) -> dict:
        return {"stdout": self.stdout.get(step["parameters"]["command"][-1], ""), "stderr": "", "returncode": 0}

    def action(self, op: dict) -> dict:
        self.ops.append(op)
        return {}


def _ctx(tmp_path: Path, desktop: FakeDesktop) -> EvalContext:
    (tmp_path / "cache").mkdir(exist_ok=True)
    return EvalContext(client=desktop, cache_dir=tmp_path / "cache", files_dir=tmp_path)  # type: ignore[arg-type]


def test_browser_profile_getters(tmp_path: Path) -> None:
    prefs = {"enable_do_not_track": True, "safebrowsing": {"enhanced": True}, "profile": {
        "name": "Work", "default_content_setting_values": {}}, "extensions": {"settings": {"x": {"path": "/ext/x"}}},
             "default_search_provider_data": {"template_url_data": {"short_name": "Bing"}}}
    marks = {"roots": {"bookmark_bar": {"children": []}}}
    ctx = _ctx(tmp_path, FakeDesktop({"~/.config/chromium/Default/Preferences": json.dumps(prefs).encode(),
                                      "~/.config/chromium/Default/Bookmarks": json.dumps(marks).encode()}))
    assert [GETTERS[n](ctx, {}) for n in ("enable_do_not_track", "enable_enhanced_safety_browsing",
                                          "data_delete_automacally", "default_search_engine", "profile_name",
                                          "find_unpacked_extension_path", "bookmarks")] \
        == ["true", "true", "true", "Bing", "Work", ["/ext/x"], {"bookmark_bar": {"children": []}}]
    empty = _ctx(tmp_path, FakeDesktop({}))
    assert [GETTERS[n](empty, {}) for n in ("enable_do_not_track", "enable_enhanced_safety_browsing",
                                            "data_delete_automacally", "default_search_engine", "profile_name",
                                            "find_unpacked_extension_path", "bookmarks")] \
        == ["false", "false", "false", "Google", None, [], {}]
    assert getters_apps.CHROME_PROFILES[1] == "~/.config/google-chrome/Default"


def test_settings_and_cache_getters(tmp_path: Path) -> None:
    desk = FakeDesktop({"~/.config/GIMP/2.10/gimprc": b"(undo-levels 100)\n", "~/.config/vlc/vlcrc": b"qt-bgcone=0\n",
                        "/home/user/.config/Code/User/settings.json": b"{}"},
                       stdout={"video/mp4": "vlc.desktop\n", "video/webm": "vlc.desktop\n", "video/ogg": "totem.desktop\n"})
    ctx = _ctx(tmp_path, desk)
    gimprc = GETTERS["gimp_config_file"](ctx, {"file_name": "gimprc", "dest": "gimprc"})
    assert Path(gimprc).read_text() == "(undo-levels 100)\n"
    assert GETTERS["gimp_config_file"](ctx, {"file_name": "sessionrc", "dest": "sessionrc"}) is None
    assert Path(GETTERS["vlc_config"](ctx, {"dest": "vlcrc"})).read_text() == "qt-bgcone=0\n"
    assert GETTERS["cache_file"](ctx, {"path": "vlcrc"}) == str(tmp_path / "cache" / "vlcrc")
    assert GETTERS["cache_file"](ctx, {"path": "../task.json"}) is None
    assert GETTERS["cache_file"](ctx, {"path": "missing"}) is None
    assert GETTERS["default_video_player"](ctx, {}) == "vlc.desktop"
    assert GETTERS["default_video_player"](_ctx(tmp_path, FakeDesktop({})), {}) == "unknown"
    got = GETTERS["vscode_config"](ctx, {"vscode_extension_command": "OpenProject", "dest": "settings.json",
                                         "path": "/home/user/.config/Code/User/settings.json"})
    assert Path(got).read_text() == "{}" and desk.ops[0] == {"op": "key", "keys": ["ctrl", "shift", "p"]}
    assert {"op": "type", "text": "OpenProject"} in desk.ops


def test_slide_media_getters(tmp_path: Path) -> None:
    slide = (f'<p:sld {P_NS} {A_NS} {R_NS}><p:cSld><p:bg><p:bgPr><a:blipFill><a:blip r:embed="rId2"/></a:blipFill>'
             '</p:bgPr></p:bg></p:cSld></p:sld>')
    rels = ('<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/image" '
            'Target="../media/image1.png"/>'
            '<Relationship Id="rId3" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/audio" '
            'Target="file:///home/user/song.mp3"/></Relationships>')
    deck = _zip(tmp_path / "deck.pptx", {"ppt/slides/slide1.xml": slide, "ppt/slides/_rels/slide1.xml.rels": rels,
                                         "ppt/media/image1.png": "PNGBYTES"})
    ctx = _ctx(tmp_path, FakeDesktop({"/home/user/deck.pptx": Path(deck).read_bytes(),
                                      "/home/user/song.mp3": b"ID3"}))
    g = {"ppt_file_path": "/home/user/deck.pptx", "slide_index": 0}
    assert Path(GETTERS["background_image_in_slide"](ctx, {**g, "dest": "bg.png"})).read_text() == "PNGBYTES"
    assert Path(GETTERS["audio_in_slide"](ctx, {**g, "dest": "a.mp3"})).read_bytes() == b"ID3"
    assert GETTERS["audio_in_slide"](ctx, {**g, "slide_index": 4, "dest": "a.mp3"}) is None
