"""Task data: rows of dicts loaded with `datasets` from local JSONL/Parquet files or the hub.

Every env also has a seeded synthetic generator, so nothing here is needed offline. Rows are
checked when loaded: a row without a required field, or with a field of the wrong type, is an
error naming the file, the line (JSONL) or row, and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

Task = dict[str, Any]


class TaskDataError(ValueError):
    """A task source cannot be read, or a row lacks a required field."""


def load_rows(source: str, *, split: str = "train") -> tuple[list[Task], list[str]]:
    """Rows of a local .jsonl/.json/.parquet file, or of hub dataset `source` (`split`), and
    where each came from ("line 7" of a JSONL file, "row 7" otherwise).

    Local paths are used when they exist; anything else is taken as a hub dataset name and
    needs network access and, for gated sets, a logged-in user.
    """
    path = Path(source)
    if path.exists() and path.suffix == ".jsonl":
        return _jsonl(path)
    import datasets  # heavy; only when a task file is actually used

    try:
        if path.exists():
            kind = {".json": "json", ".parquet": "parquet"}.get(path.suffix)
            if kind is None:
                raise TaskDataError(f"{source}: unsupported task file type {path.suffix!r} "
                                    "(use .jsonl, .json or .parquet)")
            ds = datasets.load_dataset(kind, data_files=str(path), split="train")
        else:
            ds = datasets.load_dataset(source, split=split)
    except TaskDataError:
        raise
    except Exception as e:
        raise TaskDataError(f"{source}: cannot load tasks: {e}") from e
    rows = [dict(row) for row in ds]
    return rows, [f"row {i}" for i in range(len(rows))]


def _jsonl(path: Path) -> tuple[list[Task], list[str]]:
    rows, where = [], []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TaskDataError(f"{path}: cannot read tasks: {e}") from e
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskDataError(f"{path}: line {n}: not valid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(row, dict):
            raise TaskDataError(f"{path}: line {n}: a task must be a JSON object, not {type(row).__name__}")
        rows.append(row)
        where.append(f"line {n}")
    return rows, where


def check_rows(
    rows: Iterable[Task], required: Sequence[str], source: str,
    types: Mapping[str, tuple[type, ...]] | None = None, where: Sequence[str] | None = None,
) -> list[Task]:
    """`rows` as a list, or TaskDataError naming the first row (by `where`, default "row i")
    missing a required field or holding a field of another type than `types` allows."""
    out = []
    types = types or {}
    for i, row in enumerate(rows):
        at = where[i] if where is not None else f"row {i}"
        for name in required:
            if row.get(name) is None or row.get(name) == "":
                raise TaskDataError(f"{source}: {at}: missing field {name!r}")
        for name, kinds in types.items():
            value = row.get(name)
            if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
                allowed = " or ".join(k.__name__ for k in kinds)
                raise TaskDataError(f"{source}: {at}: field {name!r} must be {allowed}, "
                                    f"not {type(value).__name__} ({value!r:.40})")
        out.append(row)
    if not out:
        raise TaskDataError(f"{source}: no task rows")
    return out


def load_tasks(
    source: str,
    *,
    split: str = "train",
    convert: Callable[[Task], Task] | None = None,
    required: Sequence[str] = ("question", "answer"),
    types: Mapping[str, tuple[type, ...]] | None = None,
) -> list[Task]:
    """Load rows from `source`, map each through `convert` (a format adapter) and check the
    result has the `required` fields, of the `types` given."""
    rows, where = load_rows(source, split=split)
    if convert is not None:
        rows = [_convert(convert, r, at, source) for r, at in zip(rows, where, strict=True)]
    return check_rows(rows, required, source, types, where)


def _convert(convert: Callable[[Task], Task], row: Task, at: str, source: str) -> Task:
    try:
        return convert(row)
    except KeyError as e:
        raise TaskDataError(f"{source}: {at}: missing field {e.args[0]!r}") from e
    except (TypeError, ValueError) as e:
        raise TaskDataError(f"{source}: {at}: {e}") from e
