"""Tasks in OSWorld's JSON shape, loaded and checked.

A task: {"id", "instruction", "related_apps", "config": [setup steps], "evaluator": {...}}
plus, in this repo, "solutions": {"oracle": [steps], "wrong": [steps]}: scripted action
sequences the tests run end to end (the oracle must score 1, the wrong one 0). A solution
step is {"action": computer_13 object or pyautogui text, "target": {"name": ..., "tag": ...}};
with a target, x and y are filled in from the accessibility tree (the widget's centre) by
`resolve`, at that moment, so scripts survive layout changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .evaluators import GETTERS, METRICS

TASK_DIR = Path(__file__).parent / "tasks"
SETUP_TYPES = frozenset({"launch", "open", "execute", "sleep", "activate_window", "close_window", "write_file"})


class TaskError(ValueError):
    """A task file that does not have the expected shape; the message names the file and field."""


@dataclass(frozen=True)
class Task:
    """One task; `source` is the file it came from."""

    id: str
    instruction: str
    config: list[dict]
    evaluator: dict
    solutions: dict[str, list[dict]]
    related_apps: list[str]
    source: str


def _check(source: str, doc: dict) -> Task:
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise TaskError(f"{source}: {what}")

    need(isinstance(doc, dict), "a task must be a JSON object")
    for key, kind in (("id", str), ("instruction", str), ("config", list), ("evaluator", dict)):
        need(isinstance(doc.get(key), kind), f"field {key!r} must be a {kind.__name__}")
    for i, step in enumerate(doc["config"]):
        need(isinstance(step, dict) and step.get("type") in SETUP_TYPES,
             f"config[{i}].type must be one of {sorted(SETUP_TYPES)}")
    ev = doc["evaluator"]
    funcs = ev.get("func") if isinstance(ev.get("func"), list) else [ev.get("func")]
    for func in funcs:
        need(func in METRICS or func == "infeasible", f"evaluator.func {func!r} is not a known metric")
    if funcs != ["infeasible"]:
        for key in ("result", "expected"):
            getters = ev.get(key) if isinstance(ev.get(key), list) else [ev.get(key)]
            need(len(getters) in (1, len(funcs)), f"evaluator.{key} must have one entry per func")
            for g in getters:
                need(isinstance(g, dict) and g.get("type") in GETTERS, f"evaluator.{key} has unknown getter {g!r}")
    need(ev.get("conj", "and") in ("and", "or"), "evaluator.conj must be 'and' or 'or'")
    solutions = doc.get("solutions", {})
    need(isinstance(solutions, dict), "field 'solutions' must be an object")
    return Task(doc["id"], doc["instruction"], doc["config"], ev, solutions, doc.get("related_apps", []), source)


def load_task(path: str | Path) -> Task:
    """Read and check one task file."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TaskError(f"{path}: {e}") from e
    return _check(str(path), doc)


def load_tasks(directory: str | Path = TASK_DIR) -> list[Task]:
    """Every task in a folder, sorted by id; ids must be unique."""
    tasks = sorted((load_task(p) for p in Path(directory).glob("*.json")), key=lambda t: t.id)
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise TaskError(f"{t.source}: duplicate task id {t.id!r}")
        seen.add(t.id)
    return tasks


class SolutionError(RuntimeError):
    """A scripted step could not be played (missing target, rejected action)."""


def resolve(step: dict, rows: list[dict]) -> str | dict:
    """The step's action with x, y filled in from its target, if it has one."""
    action = step["action"]
    target = step.get("target")
    if target is None:
        return action
    for row in rows:
        if row["name"] == target["name"] and target.get("tag", row["tag"]) == row["tag"]:
            params = {**action.get("parameters", {}), "x": row["x"] + row["w"] // 2, "y": row["y"] + row["h"] // 2}
            return {**action, "parameters": params}
    raise SolutionError(f"target {target} not in the accessibility tree: {[r['name'] for r in rows]}")
