"""Task data: rows of dicts loaded with `datasets` from local JSONL/Parquet files or the hub.

Every env also has a seeded synthetic generator, so nothing here is needed offline. Rows are
checked when loaded: a row without a required field is an error naming the row and field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

Task = dict[str, Any]


class TaskDataError(ValueError):
    """A task source cannot be read, or a row lacks a required field."""


def load_rows(source: str, *, split: str = "train") -> list[Task]:
    """Rows of a local .jsonl/.json/.parquet file, or of hub dataset `source` (`split`).

    Local paths are used when they exist; anything else is taken as a hub dataset name and
    needs network access and, for gated sets, a logged-in user.
    """
    import datasets  # heavy; only when a task file is actually used

    path = Path(source)
    try:
        if path.exists():
            kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(path.suffix)
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
    return [dict(row) for row in ds]


def check_rows(rows: Iterable[Task], required: Sequence[str], source: str) -> list[Task]:
    """`rows` as a list, or TaskDataError naming the first row missing a required field."""
    out = []
    for i, row in enumerate(rows):
        for name in required:
            if row.get(name) is None or row.get(name) == "":
                raise TaskDataError(f"{source}: row {i}: missing field {name!r}")
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
) -> list[Task]:
    """Load rows from `source`, map each through `convert` (a format adapter) and check the
    result has the `required` fields."""
    rows = load_rows(source, split=split)
    if convert is not None:
        rows = [_convert(convert, r, i, source) for i, r in enumerate(rows)]
    return check_rows(rows, required, source)


def _convert(convert: Callable[[Task], Task], row: Task, i: int, source: str) -> Task:
    try:
        return convert(row)
    except KeyError as e:
        raise TaskDataError(f"{source}: row {i}: missing field {e.args[0]!r}") from e
    except (TypeError, ValueError) as e:
        raise TaskDataError(f"{source}: row {i}: {e}") from e
