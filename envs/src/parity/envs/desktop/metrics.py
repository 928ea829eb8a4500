"""OSWorld's evaluator metrics (a subset, same names and semantics), plus a few of parity's own.

A metric is `func(result, expected, **options) -> float` in [0, 1], where result and expected
are what the getters returned (file getters return local paths). A missing file (None) or a
file its library cannot read scores 0. Files are read with openpyxl (.xlsx), python-docx
(.docx) and odfpy (.odt).

OSWorld's names here: exact_match, is_in_list, check_include_exclude, literal_match,
compare_text_file, compare_csv, compare_table (rules sheet_name, sheet_data, check_cell),
compare_docx_files, contains_page_break, is_first_line_centered, check_json_settings,
check_json, is_expected_active_tab, and infeasible (in `evaluators.evaluate`). parity's own:
normalized_match.
"""

from __future__ import annotations

import difflib
import json
import re
import zipfile
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import docx
import openpyxl
from docx.enum.text import WD_PARAGRAPH_ALIGNMENT
from docx.opc.exceptions import PackageNotFoundError
from odf import teletype
from odf.opendocument import load as load_odf
from odf.text import P

_UNREADABLE = (OSError, ValueError, KeyError, zipfile.BadZipFile, PackageNotFoundError)
"""What a library raises for a file that is missing, truncated or not its format."""


def _read(load: Callable[[str], Any], path: Any) -> Any:
    """`load(path)`, or None if there is no path or the file cannot be read."""
    if not isinstance(path, str):
        return None
    try:
        return load(path)
    except _UNREADABLE:
        return None


def _text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


# --- values ---------------------------------------------------------------------------------

def exact_match(result: Any, rules: dict) -> float:
    """result == rules["expected"]."""
    return float(result == rules["expected"])


def is_in_list(result: Any, rules: dict) -> float:
    """rules["expected"] is an element (or substring) of result."""
    return float(result is not None and rules["expected"] in result)


def check_include_exclude(result: Any, rules: dict) -> float:
    """Every rules["include"] item is in result and no rules["exclude"] item is."""
    if result is None:
        return 0.0
    return float(all(x in result for x in rules.get("include", []))
                 and all(x not in result for x in rules.get("exclude", [])))


def literal_match(result: Any, expected: Any, **options: Any) -> float:
    """As strings (options type "str", ignore_case) or element by element (type "list")."""
    def same(a: Any, b: Any) -> bool:
        a, b = str(a), str(b)
        return a.lower() == b.lower() if options.get("ignore_case", False) else a == b

    if options.get("type", "str") == "list":
        return float(isinstance(result, list | tuple) and isinstance(expected, list | tuple)
                     and len(result) == len(expected) and all(map(same, result, expected)))
    return float(same(result, expected))


def normalized_match(result: Any, rules: dict) -> float:
    """parity's: text equals rules["expected"] after collapsing whitespace, trimming, case folding."""
    def norm(text: str) -> str:
        return re.sub(r"\s+", " ", text).strip().casefold()

    return float(isinstance(result, str) and norm(result) == norm(str(rules["expected"])))


def check_json_settings(actual: Any, expected: dict, **options: Any) -> float:
    """The JSON file at `actual` holds every key of expected["expected"] with its value."""
    data = _read(lambda p: json.loads(_text(p)), actual)
    if not isinstance(data, dict):
        return 0.0
    return float(all(k in data and data[k] == v for k, v in expected["expected"].items()))


def check_json(result: Any, rules: dict) -> float:
    """The JSON file at `result` passes rules["expect"] and fails every rules["unexpect"] entry;
    an entry is {"key": [path of keys or list indices], "method": eq|ne|re|lt|le|gt|ge|approx:TOL,
    "ref": value}. A key path that is not in the file fails an "expect" entry."""
    data = _read(lambda p: json.loads(_text(p)), result)
    if data is None:
        return 0.0

    def holds(entry: dict) -> bool:
        value = data
        for key in entry["key"]:
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                return False
        return _match_value(value, entry)

    return float(all(map(holds, rules.get("expect", []))) and not any(map(holds, rules.get("unexpect", []))))


# --- the browser ----------------------------------------------------------------------------

def _same_url(a: str, b: str) -> bool:
    """URLs equal up to the case of scheme and host and a trailing slash."""
    pa, pb = urlsplit(a), urlsplit(b)
    return ((pa.scheme.lower(), pa.netloc.lower(), pa.path.rstrip("/") or "/", pa.query, pa.fragment)
            == (pb.scheme.lower(), pb.netloc.lower(), pb.path.rstrip("/") or "/", pb.query, pb.fragment))


def is_expected_active_tab(active_tab_info: Any, rule: dict) -> float:
    """The active tab shows rule["url"] (rule type "url"); `active_tab_info` is a URL or a dict
    with one under "url"."""
    if rule.get("type") != "url":
        raise ValueError(f"is_expected_active_tab: unknown rule type {rule.get('type')!r} (known: 'url')")
    url = active_tab_info.get("url") if isinstance(active_tab_info, dict) else active_tab_info
    return float(isinstance(url, str) and _same_url(url, rule["url"]))


# --- text files -----------------------------------------------------------------------------

def compare_text_file(file1: Any, file2: Any, **options: Any) -> float:
    """Two text files are equal (options ignore_blanks: whitespace runs as one space, trimmed;
    ignore_case)."""
    texts = [_read(_text, f) for f in (file1, file2)]
    if None in texts:
        return 0.0
    if options.get("ignore_blanks", False):
        texts = [re.sub(r"\s+", " ", t).strip() for t in texts]
    if options.get("ignore_case", False):
        texts = [t.lower() for t in texts]
    return float(texts[0] == texts[1])


def compare_csv(result: Any, expected: Any, **options: Any) -> float:
    """The CSV file's lines equal those of the expected file (or of any of a list of them);
    options strict (default true; false: lines are stripped), ignore_case."""
    def lines(path: str) -> list[str] | None:
        found = _read(lambda p: _text(p).splitlines(), path)
        if found is None:
            return None
        found = found if options.get("strict", True) else [line.strip() for line in found]
        return [line.lower() for line in found] if options.get("ignore_case", False) else found

    got = lines(result)
    wanted = [lines(e) for e in (expected if isinstance(expected, list) else [expected])]
    return float(got is not None and any(w == got for w in wanted if w is not None))


# --- spreadsheets (.xlsx) -------------------------------------------------------------------

def _sheet_values(ws: Any, precision: int) -> list[list[Any]]:
    """The cells' values (formulas as last computed), numbers rounded, trailing blanks dropped."""
    rows = []
    for row in ws.iter_rows(values_only=True):
        cells = [round(float(v), precision) if isinstance(v, int | float) and not isinstance(v, bool) else v
                 for v in row]
        while cells and cells[-1] in (None, ""):
            cells.pop()
        rows.append(cells)
    while rows and not rows[-1]:
        rows.pop()
    return rows


def _pick_sheet(idx: int | str, result: Any, expected: Any) -> Any:
    """OSWorld's sheet index: an int or "RI<n>"/"RN<name>" (result), "EI<n>"/"EN<name>" (expected)."""
    if isinstance(idx, int):
        book, key = result, idx
    elif idx[:2] in ("RI", "RN", "EI", "EN"):
        book = result if idx[0] == "R" else expected
        key = int(idx[2:]) if idx[1] == "I" else idx[2:]
    else:
        raise ValueError(f"unrecognised sheet index {idx!r}")
    if book is None:
        return None
    if isinstance(key, int):
        return book.worksheets[key] if key < len(book.worksheets) else None
    return book[key] if key in book.sheetnames else None


def _match_value(value: Any, rule: dict) -> bool:
    """OSWorld's value rule {"method", "ref"}: eq|ne|lt|le|gt|ge, re (or re.I, re.M...: a regex
    search with those flags), approx:<tol>, range.<a><b> (ref [lo, hi]: lo a value b hi, each
    bound "t" strict, "e" inclusive), str_list_eq / str_set_eq (a comma-separated string
    against a list). Order comparisons and ranges take numbers only."""
    method, ref = rule["method"], rule["ref"]
    if method in ("eq", "ne"):
        return (value == ref) == (method == "eq")
    if method.split(".")[0] == "re":
        flags = 0
        for name in method.split(".")[1:]:
            flags |= getattr(re, name)
        return isinstance(value, str) and re.search(ref, value, flags) is not None
    if method in ("str_list_eq", "str_set_eq"):
        kind = list if method == "str_list_eq" else set
        return isinstance(value, str) and kind(value.strip("\"'").split(",")) == kind(ref)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    if isinstance(value, str) and not method.startswith("approx:"):
        return False
    if method.startswith("approx:"):
        return abs(number - float(ref)) <= float(method[7:])
    if method.startswith("range."):
        return _RANGE[method[6]](float(ref[0]), number) and _RANGE[method[7]](number, float(ref[1]))
    compare = {"lt": float.__lt__, "le": float.__le__, "gt": float.__gt__, "ge": float.__ge__}[method]
    return compare(number, float(ref))


_RANGE = {"t": float.__lt__, "e": float.__le__}
"""OSWorld's range bounds: "t" strict (a < b), "e" inclusive (a <= b)."""


def compare_table(result: Any, expected: Any = None, **options: Any) -> float:
    """The result workbook passes every rule in options["rules"] (all must hold):
    sheet_name: the same sheet names as expected; sheet_data: sheets `sheet_idx0` and
    `sheet_idx1` hold the same values (numbers to `precision` digits, default 4);
    check_cell: cell `coordinate` of sheet `sheet_idx` meets each props.value rule."""
    def load(path: str) -> Any:
        return openpyxl.load_workbook(path, data_only=True)

    book_r = _read(load, result)
    if book_r is None:
        return 0.0
    book_e = _read(load, expected)
    for r in options["rules"]:
        if r["type"] == "sheet_name":
            ok = book_e is not None and book_r.sheetnames == book_e.sheetnames
        elif r["type"] == "sheet_data":
            sheets = [_pick_sheet(r[k], book_r, book_e) for k in ("sheet_idx0", "sheet_idx1")]
            precision = r.get("precision", 4)
            ok = None not in sheets and _sheet_values(sheets[0], precision) == _sheet_values(sheets[1], precision)
        elif r["type"] == "check_cell":
            sheet = _pick_sheet(r["sheet_idx"], book_r, book_e)
            ok = sheet is not None and all(_match_value(sheet[r["coordinate"]].value, rule)
                                           for rule in r["props"].values())
        else:
            raise ValueError(f"compare_table: unknown rule type {r['type']!r}")
        if not ok:
            return 0.0
    return 1.0


# --- documents (.docx, .odt) ----------------------------------------------------------------

def _paragraphs(path: str) -> list[str]:
    if path.endswith(".odt"):
        return [teletype.extractText(p) for p in load_odf(path).getElementsByType(P)]
    return [p.text for p in docx.Document(path).paragraphs]


def compare_docx_files(file1: Any, file2: Any, **options: Any) -> float:
    """Two documents (.docx or .odt) have the same text. Options: ignore_blanks (default true:
    all paragraphs as one text, whitespace runs as one space), ignore_case, ignore_order (sort
    paragraphs), delete_empty_lines, content_only (the texts' similarity ratio, 0..1)."""
    docs = [_read(_paragraphs, f) for f in (file1, file2)]
    if None in docs:
        return 0.0
    if options.get("delete_empty_lines", False):
        docs = [[p for p in d if p.strip()] for d in docs]
    if options.get("ignore_order", False):
        docs = [sorted(d) for d in docs]
    if options.get("ignore_case", False):
        docs = [[p.lower() for p in d] for d in docs]
    if options.get("content_only", False):
        a, b = (re.sub(r"\s+", " ", "\n".join(d)).strip() for d in docs)
        return difflib.SequenceMatcher(None, a, b).ratio()
    if options.get("ignore_blanks", True):
        a, b = (re.sub(r"\s+", " ", "\n".join(d)).strip() for d in docs)
        return float(a == b)
    return float(docs[0] == docs[1])


def contains_page_break(docx_file: Any, rules: dict | None = None) -> float:
    """The .docx has a page break (a break of type page, or a paragraph that starts a page);
    with rules["page_break_count"], exactly that many."""
    doc = _read(docx.Document, docx_file)
    if doc is None:
        return 0.0
    ns = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
    count = sum(1 for p in doc.paragraphs for br in p._p.iter(f"{ns}br") if br.get(f"{ns}type") == "page")
    count += sum(1 for p in doc.paragraphs if p.paragraph_format.page_break_before)
    wanted = (rules or {}).get("page_break_count")
    return float(count > 0 and (wanted is None or count == wanted))


def is_first_line_centered(docx_file: Any) -> float:
    """The .docx's first paragraph is centred."""
    doc = _read(docx.Document, docx_file)
    return float(doc is not None and bool(doc.paragraphs)
                 and doc.paragraphs[0].alignment == WD_PARAGRAPH_ALIGNMENT.CENTER)


METRICS: dict[str, Callable[..., float]] = {
    f.__name__: f for f in (exact_match, is_in_list, check_include_exclude, literal_match, normalized_match,
                            check_json_settings, check_json, is_expected_active_tab, compare_text_file,
                            compare_csv, compare_table, compare_docx_files, contains_page_break,
                            is_first_line_centered)
}
