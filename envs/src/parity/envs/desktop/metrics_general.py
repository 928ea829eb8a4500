"""OSWorld's metrics on plain files, PDFs, archives, CSV and JSON files (VS Code's settings
and keybindings among them), and on short values; applications' own settings are
`metrics_apps`.

A metric is `func(result, expected_or_rules, **options) -> float`; a missing or unreadable
file scores 0. PDFs are read with pypdf; text similarities are difflib's ratio where OSWorld
uses rapidfuzz's `fuzz.ratio`. Nothing a task names is executed: `check_gnome_favorite_apps`
reads a Python list literal with `ast.literal_eval`, and `run_sqlite3` opens the copied
database read-only.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import re
import sqlite3
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docx
import openpyxl
from pypdf import PdfReader
from pypdf.errors import PyPdfError

from . import metrics_images, metrics_slides
from .metrics import (
    _match_value,
    _read,
    _text,
    compare_csv,
    compare_docx_files,
    compare_table,
    compare_text_file,
)


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


# --- PDFs and archives ----------------------------------------------------------------------

def _pdf_text(source: Any) -> str | None:
    """The text of every page, stripped (None if it is not a readable PDF)."""
    try:
        return "".join(page.extract_text() or "" for page in PdfReader(source).pages).strip()
    except (PyPdfError, OSError, ValueError, KeyError, TypeError):
        return None


def compare_pdfs(pdf1: Any, pdf2: Any) -> float:
    """The mean text similarity of each PDF to its expected one (one pair, or two lists)."""
    pairs = list(zip(pdf1, pdf2, strict=False)) if isinstance(pdf2, list) and isinstance(pdf1, list) \
        else [(pdf1, pdf2)]
    score = 0.0
    for a, b in pairs:
        ta, tb = (_pdf_text(p) if isinstance(p, str) else None for p in (a, b))
        if ta is not None and tb is not None:
            score += _ratio(ta, tb)
    return score / len(pairs) if pairs else 0.0


def check_pdf_pages(pdf_file: Any, rules: dict) -> float:
    """The page count passes rules["relation"] (lt, le, eq, ne, ge, gt) against rules["ref_value"]."""
    try:
        pages = len(PdfReader(pdf_file).pages) if isinstance(pdf_file, str) else None
    except (PyPdfError, OSError, ValueError):
        pages = None
    return float(pages is not None and _match_value(pages, {"method": rules["relation"], "ref": rules["ref_value"]}))


_ARCHIVE_COMPARE: dict[str, Callable[..., float]] = {
    "text": compare_text_file, "pdf": compare_pdfs, "docx": compare_docx_files, "csv": compare_csv,
    "table": compare_table, "ppt": metrics_slides.compare_pptx_files, "image": metrics_images.compare_images}


def _extract(archive: str, into: Path) -> bool:
    """Unpack a .zip or tar archive, refusing members that would land outside `into`."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                if any(not (into / n).resolve().is_relative_to(into.resolve()) for n in z.namelist()):
                    return False
                z.extractall(into)
            return True
        with tarfile.open(archive) as t:
            t.extractall(into, filter="data")
        return True
    except (OSError, zipfile.BadZipFile, tarfile.TarError, ValueError):
        return False


def compare_archive(pred: Any, gold: Any, **options: Any) -> float:
    """The archives hold the same file names (under options file_path) and each pair of files
    is alike by the metric for options file_type (text, pdf, docx, csv, table, ppt, image);
    the mean of those scores."""
    if not isinstance(pred, str) or not isinstance(gold, str):
        return 0.0
    sub, kind = options.pop("file_path", ""), options.pop("file_type", "text")
    compare = _ARCHIVE_COMPARE[kind]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / "pred", Path(tmp) / "gold"]
        if not all(_extract(a, d) for a, d in zip((pred, gold), dirs, strict=True)):
            return 0.0
        try:
            names = [sorted(p.name for p in (d / sub).iterdir()) for d in dirs]
        except OSError:
            return 0.0
        if names[0] != names[1] or not names[0]:
            return float(names[0] == names[1])
        return sum(compare(str(dirs[0] / sub / n), str(dirs[1] / sub / n), **options)
                   for n in names[0]) / len(names[0])


def compare_zip_files(actual: Any, expected: Any) -> float:
    """The zip files hold the same names with the same bytes (PDFs: text similarity >= 0.95)."""
    def entries(path: str) -> dict[str, bytes]:
        with zipfile.ZipFile(path) as z:
            return {n: z.read(n) for n in z.namelist()}

    a, b = _read(entries, actual), _read(entries, expected)
    if a is None or b is None or a.keys() != b.keys():
        return 0.0
    for name in a:
        if name.lower().endswith(".pdf"):
            ta, tb = _pdf_text(io.BytesIO(a[name])), _pdf_text(io.BytesIO(b[name]))
            if ta is None or tb is None or _ratio(ta, tb) < 0.95:
                return 0.0
        elif a[name] != b[name]:
            return 0.0
    return 1.0


# --- text files -----------------------------------------------------------------------------

def check_list(result: Any, rules: dict) -> float:
    """Every rules["expect"] regex matches some line of the file; no rules["unexpect"] regex
    matches any."""
    lines = _read(lambda p: _text(p).splitlines(), result)
    if lines is None:
        return 0.0
    return float(all(any(re.search(r, line) for line in lines) for r in rules.get("expect", []))
                 and not any(re.search(r, line) for r in rules.get("unexpect", []) for line in lines))


def _matches(record: dict, row: dict) -> bool:
    return all(k in row and row[k] == v for k, v in record.items())


def check_csv(result: Any, rules: dict) -> float:
    """Every rules["expect"] record ({column: value}) equals some row of the CSV; no
    rules["unexpect"] record equals any."""
    rows = _read(lambda p: list(csv.DictReader(io.StringIO(_text(p)))), result)
    if rows is None:
        return 0.0
    return float(all(any(_matches(r, row) for row in rows) for r in rules.get("expect", []))
                 and not any(_matches(r, row) for r in rules.get("unexpect", []) for row in rows))


def file_contains(result: Any, rules: dict) -> float:
    """The file's text contains every string in rules["expected"]."""
    text = _read(_text, result)
    return float(text is not None and all(want in text for want in rules["expected"]))


def diff_text_file(result: Any, expected: Any) -> float:
    """The similarity ratio of the two files' lists of lines."""
    a, b = (_read(lambda p: _text(p).splitlines(), f) for f in (result, expected))
    return 0.0 if a is None or b is None else difflib.SequenceMatcher(None, a, b).ratio()


def compare_result_files(src: Any, tgt: Any) -> float:
    """The files hold the same text (trimmed); where the expected one is a number, it may also
    appear within the result, or the result be that number within 1e-4."""
    a, b = (_read(lambda p: _text(p).strip(), f) for f in (src, tgt))
    if a is None or b is None:
        return 0.0
    try:
        want = float(b)
    except ValueError:
        return float(a == b)
    if b in a:
        return 1.0
    try:
        return float(abs(float(a) - want) < 1e-4)
    except ValueError:
        return 0.0


def compare_config(actual: Any, rules: dict) -> float:
    """The file's text is exactly rules["expected"]."""
    return float(_read(_text, actual) == rules["expected"])


def check_json_keybindings(actual: Any, expected: dict) -> float:
    """The JSON list in the file (VS Code's keybindings.json, whose first line may be a
    comment) holds expected["expected"]."""
    def load(path: str) -> Any:
        text = _text(path)
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return json.loads(text.split("\n", 1)[1] if "\n" in text else "")

    data = _read(load, actual)
    return float(isinstance(data, list) and expected["expected"] in data)


def fuzzy_place_math(result: Any, rules: dict) -> float:
    """The document has exactly three words, each scored by its best similarity to one of
    rules["expected"]; their mean."""
    doc = _read(docx.Document, result)
    if doc is None:
        return 0.0
    words = [w for p in doc.paragraphs for w in p.text.split()]
    if len(words) != 3:
        return 0.0
    return sum(max((_ratio(w, a) for a in rules["expected"]), default=0.0) for w in words) / 3


def compare_conference_city_in_order(result: Any, rules: dict) -> float:
    """Cells C2:C22 of the workbook's active sheet contain, in order, each expected city (or
    one of a list of spellings)."""
    book = _read(openpyxl.load_workbook, result)
    if book is None:
        return 0.0
    cells = [str(c.value) if c.value is not None else "" for row in book.active["C2:C22"] for c in row]
    expected = rules["expected"]
    if len(expected) < len(cells):
        cells = cells[:len(expected)]
    return float(all(any(s in cell for s in ([want] if isinstance(want, str) else want))
                     for cell, want in zip(cells, expected, strict=False)))


def run_sqlite3(result: Any, rules: dict) -> float:
    """The first column of the first row of rules["sql"] on the database (read-only)."""
    if not isinstance(result, str):
        return 0.0
    try:
        with sqlite3.connect(f"file:{result}?mode=ro", uri=True) as db:
            row = db.execute(rules["sql"]).fetchone()
    except sqlite3.Error:
        return 0.0
    return float(row[0] or 0) if row else 0.0


# --- values ---------------------------------------------------------------------------------

def check_direct_json_object(result: Any, rules: dict) -> float:
    """The object (or JSON text, single quotes read as double) has rules["expected"]'s values
    at its keys; with expect_in_result, each expected string is within the value and each
    expected list shares an element with it."""
    if isinstance(result, str):
        try:
            result = json.loads(result.strip().replace("'", '"'))
        except json.JSONDecodeError:
            return 0.0
    if not isinstance(result, dict):
        return 0.0
    for key, want in rules["expected"].items():
        got = result.get(key)
        if not rules.get("expect_in_result", False):
            ok = got == want
        elif isinstance(want, list):
            ok = isinstance(got, list) and any(w in got for w in want)
        else:
            ok = isinstance(want, str) and isinstance(got, str) and want in got
        if not ok:
            return 0.0
    return 1.0


METRICS: dict[str, Callable[..., float]] = {
    f.__name__: f for f in (compare_pdfs, check_pdf_pages, compare_archive, compare_zip_files, check_list,
                            check_csv, file_contains, diff_text_file, compare_result_files, compare_config,
                            check_json_keybindings, fuzzy_place_math, compare_conference_city_in_order,
                            run_sqlite3, check_direct_json_object)
}
