"""Task files, metrics and the linearised accessibility tree (no desktop needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parity.envs.desktop.a11y import approx_tokens, linearize
from parity.envs.desktop.evaluators import (
    compare_json,
    compare_table,
    contains,
    exact_match,
    list_contains,
    normalized_match,
)
from parity.envs.desktop.tasks import SETUP_TYPES, TaskError, load_task, load_tasks


def test_shipped_tasks_cover_every_app_with_oracle_and_wrong_solutions() -> None:
    tasks = load_tasks()
    assert len(tasks) >= 12
    assert {app for t in tasks for app in t.related_apps} == {"textedit", "terminal", "files", "sheet", "settings"}
    for t in tasks:
        assert t.solutions["oracle"] and t.solutions["wrong"], t.id
        assert t.solutions["oracle"] != t.solutions["wrong"], t.id
        assert {s["type"] for s in t.config} <= SETUP_TYPES


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return path


GOOD = {"id": "x", "instruction": "do it", "config": [{"type": "launch", "parameters": {"command": ["files"]}}],
        "evaluator": {"func": "exact_match", "result": {"type": "vm_file", "path": "~/a"},
                      "expected": {"type": "rule", "rules": {"expected": "a"}}}}


@pytest.mark.parametrize(("change", "message"), [
    ({"id": 3}, "field 'id' must be a str"),
    ({"config": [{"type": "format_disk"}]}, "config[0].type must be one of"),
    ({"evaluator": {**GOOD["evaluator"], "func": "vibes"}}, "evaluator.func 'vibes' is not a known metric"),
    ({"evaluator": {**GOOD["evaluator"], "result": {"type": "nope"}}}, "evaluator.result has unknown getter"),
    ({"evaluator": {**GOOD["evaluator"], "conj": "xor"}}, "evaluator.conj must be 'and' or 'or'"),
])
def test_bad_task_files_name_the_field(tmp_path: Path, change: dict, message: str) -> None:
    path = _write(tmp_path, {**GOOD, **change})
    with pytest.raises(TaskError) as err:
        load_task(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_malformed_task_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{")
    with pytest.raises(TaskError, match=r"broken\.json"):
        load_task(path)


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(GOOD))
    with pytest.raises(TaskError, match="duplicate task id 'x'"):
        load_tasks(tmp_path)


def test_metrics() -> None:
    assert exact_match("a", "a") == 1.0 and exact_match(None, "a") == 0.0 and exact_match(None, None) == 1.0
    assert normalized_match("  42\n", "42") == 1.0 and normalized_match("Hello  World", "hello world") == 1.0
    assert normalized_match(None, "42") == 0.0 and normalized_match("421", "42") == 0.0
    assert contains("buy milk\ncall mom", "call mom") == 1.0 and contains(None, "x") == 0.0
    assert list_contains(["a", "b"], {"include": ["a"], "exclude": ["c"]}) == 1.0
    assert list_contains(["a", "c"], {"include": ["a"], "exclude": ["c"]}) == 0.0
    assert list_contains(None, {"include": []}) == 0.0
    assert compare_table("a,7.0\nb,3,\n\n", [["a", "7"], ["b", "3"]]) == 1.0
    assert compare_table("a,7\n", [["a", "8"]]) == 0.0 and compare_table(None, [["a"]]) == 0.0
    assert compare_json('{"a": true, "b": 1}', {"a": True}) == 1.0
    assert compare_json('{"a": false}', {"a": True}) == 0.0 and compare_json("{", {"a": 1}) == 0.0
    assert compare_json('{"b": 1}', {"a": None}) == 0.0


ROWS = [{"tag": "push-button", "name": f"B{i}", "text": "t\tx\ny", "class": "Button", "description": "",
         "x": i, "y": 2 * i, "w": 10, "h": 5} for i in range(100)]


def test_linearize_is_a_table_capped_by_tokens() -> None:
    text = linearize(ROWS, max_tokens=10_000)
    lines = text.split("\n")
    assert lines[0] == "tag\tname\ttext\tclass\tdescription\tposition\tsize"
    assert lines[4] == "push-button\tB3\tt x y\tButton\t\t(3, 6)\t(10, 5)"
    assert len(lines) == 101
    capped = linearize(ROWS, max_tokens=100)
    assert approx_tokens(capped) <= 100 + 20  # the last "more rows" line is extra
    assert capped.split("\n")[-1].startswith("... (") and "more rows cut at 100 tokens" in capped


def test_linearize_replaces_unprintable_characters() -> None:
    row = {**ROWS[0], "name": "caf\u00e9\x00"}
    assert "caf??" in linearize([row])
