"""Tasks in OSWorld's JSON shape, loaded and checked.

A task: {"id", "instruction", "related_apps", "config": [setup steps], "evaluator": {...}}
(other OSWorld keys such as "snapshot", "source" or "trajectory" are ignored) plus, in this
repo, "solutions": {"oracle": [steps], "wrong": [steps]}: scripted action
sequences the tests run end to end (the oracle must score 1, the wrong one 0). A solution
step is {"action": computer_13 object or pyautogui text, "target": {"name": ..., "tag": ...}};
with a target, x and y are filled in from the accessibility tree (the widget's centre) by
`resolve`, at that moment, so scripts survive layout changes.

Files a task needs come with it, in `files/` next to its JSON: OSWorld's `download` setup step
and `cloud_file` getter name a URL, and here the shipped file is found by the name the task
gives it (the download's target basename, the getter's `dest`), else by the URL's last part
(the desktop has no network). A task whose file is not there is refused when it is loaded.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

from .evaluators import funcs_of
from .getters import GETTERS, shipped_file
from .metrics import METRICS

TASK_DIR = Path(__file__).parent / "tasks"
GUEST_SETUP_TYPES = frozenset({"launch", "open", "execute", "sleep", "activate_window", "close_window", "write_file"})
SETUP_TYPES = GUEST_SETUP_TYPES | {"download", "command"}
"""Setup steps a task may use: the guest's own, and OSWorld's `download` (a shipped file is
written into the desktop) and `command` (OSWorld's other name for `execute`)."""


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

    @property
    def files_dir(self) -> Path:
        """The folder of files shipped with this task."""
        return Path(self.source).parent / "files"


def _check(source: str, doc: dict) -> Task:
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise TaskError(f"{source}: {what}")

    need(isinstance(doc, dict), "a task must be a JSON object")
    for key, kind in (("id", str), ("instruction", str), ("config", list), ("evaluator", dict)):
        need(isinstance(doc.get(key), kind), f"field {key!r} must be a {kind.__name__}")
    files_dir = Path(source).parent / "files"

    def need_file(url: object, name: object, where: str) -> None:
        found = shipped_file(files_dir, str(url), name if isinstance(name, str) else None)
        need(isinstance(url, str) and found.is_file(),
             f"{where}: file {url!r} is not shipped with the task (looked for {found}; the desktop has no network)")

    for i, step in enumerate(doc["config"]):
        need(isinstance(step, dict) and step.get("type") in SETUP_TYPES,
             f"config[{i}].type must be one of {sorted(SETUP_TYPES)}")
        if step["type"] == "download":
            for f in step.get("parameters", {}).get("files", []):
                need_file(f.get("url"), f.get("path"), f"config[{i}] (download)")
    ev = doc["evaluator"]
    for i, step in enumerate(ev.get("postconfig", [])):
        need(isinstance(step, dict) and step.get("type") in SETUP_TYPES - {"download"},
             f"evaluator.postconfig[{i}].type must be one of {sorted(SETUP_TYPES - {'download'})}")
    need("func" in ev, "evaluator.func is missing")
    funcs = funcs_of(ev)
    for func in funcs:
        need(func in METRICS or func == "infeasible", f"evaluator.func {func!r} is not a known metric "
                                                      f"(known: {sorted(METRICS)} and 'infeasible')")
    if funcs != ["infeasible"]:
        for key in ("result", "expected"):
            if key == "expected" and ev.get(key) is None:
                continue  # one-argument metrics such as is_first_line_centered
            getters = ev.get(key) if isinstance(ev.get(key), list) else [ev.get(key)]
            need(len(getters) in (1, len(funcs)), f"evaluator.{key} must have one entry per func")
            for g in getters:
                need(isinstance(g, dict) and g.get("type") in GETTERS,
                     f"evaluator.{key} has unknown getter {g!r} (known: {sorted(GETTERS)})")
                if g["type"] == "cloud_file":
                    pairs = zip(g["path"], g["dest"], strict=False) if g.get("multi") else [(g.get("path"), g.get("dest"))]
                    for url, dest in pairs:
                        need_file(url, dest, f"evaluator.{key} (cloud_file)")
    need(ev.get("conj", "and") in ("and", "or"), "evaluator.conj must be 'and' or 'or'")
    solutions = doc.get("solutions", {})
    need(isinstance(solutions, dict), "field 'solutions' must be an object")
    return Task(doc["id"], doc["instruction"], doc["config"], ev, solutions, doc.get("related_apps", []), source)


def guest_steps(task: Task) -> list[dict]:
    """The task's config with each `download` as one `write_file` per shipped file (its
    bytes in base64); `steps.run_step` runs them."""
    steps = []
    for step in task.config:
        if step["type"] == "download":
            for f in step["parameters"]["files"]:
                data = base64.b64encode(shipped_file(task.files_dir, f["url"], f["path"]).read_bytes()).decode()
                steps.append({"type": "write_file", "parameters": {"path": f["path"], "content_base64": data}})
        else:
            steps.append(step)
    return steps


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
