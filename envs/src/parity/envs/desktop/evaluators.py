"""OSWorld-style evaluation: getters read the desktop's state, metrics score it, `evaluate` combines.

An evaluator is {"func": name or [names], "conj": "and"|"or", "result": getter or [getters],
"expected": getter or [getters], "options": {} or [{}]}. A getter is {"type": ..., ...}; the
`rule` getter holds the expected value as {"type": "rule", "rules": {"expected": VALUE}}.
Scores are in [0, 1]; a getter that cannot read its state scores 0, it does not raise.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from typing import Any

from .client import DesktopClient, DesktopRequestError

# --- getters -------------------------------------------------------------------------------

def _vm_file(c: DesktopClient, g: dict) -> str | None:
    """The text of a file (None if it does not exist or is a folder)."""
    return c.file(g["path"])["content"]


def _vm_path_kind(c: DesktopClient, g: dict) -> str | None:
    """"file", "dir" or None."""
    f = c.file(g["path"])
    return None if not f["exists"] else "dir" if f["is_dir"] else "file"


def _vm_dir_entries(c: DesktopClient, g: dict) -> list[str] | None:
    """The names in a folder (None if it is not a folder)."""
    return c.file(g["path"])["entries"]


def _active_window_title(c: DesktopClient, g: dict) -> str | None:
    return c.windows()["active"]


def _window_titles(c: DesktopClient, g: dict) -> list[str]:
    return c.windows()["titles"]


def _accessibility_text(c: DesktopClient, g: dict) -> str | None:
    """App state: the text of the active app's first widget with this name (and tag, if given)."""
    for row in c.accessibility():
        if row["name"] == g["name"] and row["tag"] == g.get("tag", row["tag"]) != "window":
            return row["text"]
    return None


def _rule(c: DesktopClient, g: dict) -> Any:
    return g["rules"]["expected"]


GETTERS: dict[str, Callable[[DesktopClient, dict], Any]] = {
    "vm_file": _vm_file, "vm_path_kind": _vm_path_kind, "vm_dir_entries": _vm_dir_entries,
    "active_window_title": _active_window_title, "window_titles": _window_titles,
    "accessibility_text": _accessibility_text, "rule": _rule,
}


# --- metrics -------------------------------------------------------------------------------

def exact_match(result: Any, expected: Any) -> float:
    return float(result == expected)


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def normalized_match(result: Any, expected: Any) -> float:
    """Equal after collapsing whitespace, trimming and case folding."""
    return float(isinstance(result, str) and _norm(result) == _norm(str(expected)))


def contains(result: Any, expected: Any) -> float:
    """`expected` is a substring of the text (or an element of the list)."""
    return float(result is not None and expected in result)


def list_contains(result: Any, expected: Any, **_: Any) -> float:
    """`expected` = {"include": [...], "exclude": [...]} against a list such as folder entries."""
    if not isinstance(result, list):
        return 0.0
    return float(all(x in result for x in expected.get("include", []))
                 and not any(x in result for x in expected.get("exclude", [])))


def _cell(text: str) -> str | float:
    try:
        return float(text)
    except ValueError:
        return text.strip()


def compare_table(result: Any, expected: Any) -> float:
    """CSV text equals the expected rows, cell by cell (numbers by value, empty trailing cells ignored)."""
    if not isinstance(result, str):
        return 0.0

    def rows(table: list[list[str]]) -> list[list[str | float]]:
        out = [[_cell(c) for c in row] for row in table]
        for row in out:
            while row and row[-1] == "":
                row.pop()
        while out and not out[-1]:
            out.pop()
        return out

    return float(rows(list(csv.reader(io.StringIO(result)))) == rows(expected))


def compare_json(result: Any, expected: Any) -> float:
    """The JSON text parses to an object holding every expected key with its expected value."""
    try:
        doc = json.loads(result) if isinstance(result, str) else None
    except json.JSONDecodeError:
        return 0.0
    return float(isinstance(doc, dict) and all(doc.get(k, object()) == v for k, v in expected.items()))


METRICS: dict[str, Callable[..., float]] = {
    "exact_match": exact_match, "normalized_match": normalized_match, "contains": contains,
    "list_contains": list_contains, "compare_table": compare_table, "compare_json": compare_json,
}


def _as_list(value: Any, n: int) -> list:
    return value if isinstance(value, list) else [value] * n


def evaluate(client: DesktopClient, evaluator: dict, last_action: str | None) -> float:
    """Score the episode in [0, 1]. `last_action` is "done", "fail" or None (ran out of steps).

    The metric "infeasible" scores 1 exactly when the agent answered FAIL.
    """
    funcs = evaluator["func"] if isinstance(evaluator["func"], list) else [evaluator["func"]]
    if funcs == ["infeasible"]:
        return float(last_action == "fail")
    if last_action == "fail":
        return 0.0
    n = len(funcs)
    results = _as_list(evaluator.get("result"), n)
    expected = _as_list(evaluator.get("expected"), n)
    options = _as_list(evaluator.get("options", {}), n)
    scores = []
    for func, res, exp, opt in zip(funcs, results, expected, options, strict=True):
        try:
            got = GETTERS[res["type"]](client, res)
            want = GETTERS[exp["type"]](client, exp) if exp is not None else None
        except DesktopRequestError:
            got, want = None, object()  # unreadable state never matches
        scores.append(METRICS[func](got, want, **opt))
    return min(scores) if evaluator.get("conj", "and") == "and" else max(scores)
