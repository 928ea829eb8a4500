"""Task files through `datasets`: JSONL and Parquet, and errors naming the row and field."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parity.envs.data import TaskDataError, load_tasks
from parity.envs.python_tool import PythonToolEnv

ROWS = [{"question": "Q: 2*3=?", "answer": "6"}, {"question": "Q: 4*5=?", "answer": "20"}]


def test_jsonl_and_parquet_load_the_same_rows(tmp_path) -> None:
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    assert load_tasks(str(jsonl)) == ROWS
    assert load_tasks(str(parquet)) == ROWS


def test_missing_field_names_file_line_and_field(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps({"question": "Q: 1=?", "answer": None}) + "\n")
    with pytest.raises(TaskDataError, match=rf"^{path}: line 3: missing field 'answer'$"):
        load_tasks(str(path))
    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([ROWS[0], {"question": "Q: 1=?", "answer": None}]), parquet)
    with pytest.raises(TaskDataError, match=rf"^{parquet}: row 1: missing field 'answer'$"):
        load_tasks(str(parquet))


def test_a_field_of_the_wrong_type_is_refused_at_load(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"question": 5, "answer": "5"}) + "\n")
    with pytest.raises(TaskDataError, match=rf"^{path}: line 2: field 'question' must be str, not int \(5\)$"):
        PythonToolEnv(tasks=str(path))
    path.write_text(json.dumps({"question": "Q: 1+1=?", "answer": 2}) + "\n")
    assert PythonToolEnv(tasks=str(path)).tasks == [{"question": "Q: 1+1=?", "answer": 2}]


def test_bad_sources(tmp_path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("question,answer\n")
    with pytest.raises(TaskDataError, match=r"t.csv: unsupported task file type '.csv'"):
        load_tasks(str(bad))
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(TaskDataError, match=r"broken.jsonl: line 2: not valid JSON: .* \(column 2\)$"):
        load_tasks(str(broken))
    listed = tmp_path / "list.jsonl"
    listed.write_text("[1, 2]\n")
    with pytest.raises(TaskDataError, match=r"list.jsonl: line 1: a task must be a JSON object, not list"):
        load_tasks(str(listed))


def test_env_trains_on_a_task_file(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = PythonToolEnv(tasks=str(path))
    _, info = env.reset(seed=0)
    assert info["task"] in ROWS
    # rows without `code` have no tool step in the oracle: it answers directly
    assert env.oracle_action() == f"<ans>{info['task']['answer']}</ans>"
    env.close()
