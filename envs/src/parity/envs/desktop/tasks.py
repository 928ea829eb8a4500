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

What cannot run without a network is refused at load with that reason, naming the field: a
setup step that signs in (`login`) or uses Google Drive (`googledrive`, the `googledrive_file`
getter), browser tabs or a launched program that open a web address, and getters that fetch a
web page (`NETWORK_GETTERS`). The rest of OSWorld's setup vocabulary is translated by
`steps.osworld_step`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from .evaluators import funcs_of
from .getters import shipped_file
from .steps import setup_steps
from .vocabulary import GETTERS, METRICS

TASK_DIR = Path(__file__).parent / "tasks"
GUEST_SETUP_TYPES = frozenset({"launch", "open", "execute", "sleep", "activate_window", "close_window", "write_file"})
SETUP_TYPES = GUEST_SETUP_TYPES | {"download", "command", "chrome_open_tabs"}
"""Setup steps a task may use: the guest's own, and OSWorld's `download` (a shipped file is
written into the desktop), `command` (OSWorld's other name for `execute`) and
`chrome_open_tabs` (local pages only, opened by a browser launch)."""
NETWORK_SETUP_TYPES = {"login": "a login", "googledrive": "Google Drive"}
NETWORK_GETTERS = {"googledrive_file": "Google Drive", "info_from_website": "the internet",
                   "pdf_from_url": "the internet", "page_info": "the internet",
                   "gotoRecreationPage_and_get_html_content": "the internet"}
"""OSWorld's setup steps and getters that cannot work without a network, and what they need."""
WEB_URL = re.compile(r"^(https?|ftp)://(?!(localhost|127\.0\.0\.1)([:/]|$))", re.IGNORECASE)


class TaskError(ValueError):
    """A task file that does not have the expected shape; the message names the file and field.
    `reason` is the refusal without the file, short enough to count refusals by."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message.split(": ", 1)[-1]


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
    def need(cond: bool, what: str, reason: str | None = None) -> None:
        if not cond:
            raise TaskError(f"{source}: {what}", reason)

    need(isinstance(doc, dict), "a task must be a JSON object")
    doc = {"config": [], **doc}  # OSWorld runs a task without a config as one with no setup
    for key, kind in (("id", str), ("instruction", str), ("config", list), ("evaluator", dict)):
        need(isinstance(doc.get(key), kind), f"field {key!r} must be a {kind.__name__}")
    files_dir = Path(source).parent / "files"

    def need_file(url: object, name: object, where: str) -> None:
        found = shipped_file(files_dir, str(url), name if isinstance(name, str) else None)
        need(isinstance(url, str) and found.is_file(),
             f"{where}: file {url!r} is not shipped with the task (looked for {found}; the desktop has no network)",
             "a file is not shipped with the task")

    ev = doc["evaluator"]
    steps = [(f"config[{i}]", step) for i, step in enumerate(doc["config"])]
    steps += [(f"evaluator.postconfig[{i}]", step) for i, step in enumerate(ev.get("postconfig", []))]
    for where, step in steps:
        need(isinstance(step, dict), f"{where} must be an object")
        for field, needs in _network_needs(step):
            need(False, f"{where}.{field} needs {needs}, which the desktop does not have",
                 f"needs {needs} ({step.get('type')})")
        need(step.get("type") in SETUP_TYPES, f"{where}.type must be one of {sorted(SETUP_TYPES)}",
             f"setup step {step.get('type')!r} is not supported")
        if step["type"] == "download":
            for f in step.get("parameters", {}).get("files", []):
                need_file(f.get("url"), f.get("path"), f"{where} (download)")
    for key in ("result", "expected"):
        for g in ev.get(key) if isinstance(ev.get(key), list) else [ev.get(key)]:
            if isinstance(g, dict) and g.get("type") in NETWORK_GETTERS:
                needs = NETWORK_GETTERS[g["type"]]
                need(False, f"evaluator.{key} getter {g['type']!r} needs {needs}, which the desktop does not have",
                     f"needs {needs} ({g['type']})")
    need("func" in ev, "evaluator.func is missing")
    funcs = funcs_of(ev)
    need(all(funcs), "evaluator.func is empty (the task has no evaluator)")
    for func in funcs:
        need(func in METRICS or func == "infeasible", f"evaluator.func {func!r} is not a known metric "
                                                      f"(known: {sorted(METRICS)} and 'infeasible')",
             f"metric {func!r} is not implemented")
    if funcs != ["infeasible"]:
        for key in ("result", "expected"):
            if key == "expected" and ev.get(key) is None:
                continue  # one-argument metrics such as is_first_line_centered
            getters = ev.get(key) if isinstance(ev.get(key), list) else [ev.get(key)]
            need(len(getters) in (1, len(funcs)), f"evaluator.{key} must have one entry per func")
            for g in getters:
                need(isinstance(g, dict) and g.get("type") in GETTERS,
                     f"evaluator.{key} has unknown getter {g!r} (known: {sorted(GETTERS)})",
                     f"getter {g.get('type') if isinstance(g, dict) else g!r} is not implemented")
                if g["type"] == "cloud_file":
                    pairs = zip(g["path"], g["dest"], strict=False) if g.get("multi") else [(g.get("path"), g.get("dest"))]
                    for url, dest in pairs:
                        need_file(url, dest, f"evaluator.{key} (cloud_file)")
    need(ev.get("conj", "and") in ("and", "or"), "evaluator.conj must be 'and' or 'or'")
    solutions = doc.get("solutions", {})
    need(isinstance(solutions, dict), "field 'solutions' must be an object")
    return Task(doc["id"], doc["instruction"], doc["config"], ev, solutions, doc.get("related_apps", []), source)


def _network_needs(step: dict) -> list[tuple[str, str]]:
    """(field, what it needs) for each part of a setup step that needs a network."""
    params = step.get("parameters", {}) if isinstance(step.get("parameters"), dict) else {}
    if step.get("type") in NETWORK_SETUP_TYPES:
        return [("type", NETWORK_SETUP_TYPES[step["type"]])]
    if step.get("type") == "chrome_open_tabs":
        urls = params.get("urls_to_open", [])
        return [(f"parameters.urls_to_open[{i}]", "the internet") for i, u in enumerate(urls) if WEB_URL.match(str(u))]
    if step.get("type") in ("launch", "open"):
        args = params.get("command", []) if step["type"] == "launch" else [params.get("path", "")]
        args = args.split() if isinstance(args, str) else args
        return [("parameters", "the internet") for a in args if WEB_URL.match(str(a))][:1]
    return []


def guest_steps(task: Task) -> list[dict]:
    """The task's config as the guest runs it (`setup_steps`)."""
    return setup_steps(task.config, task.files_dir)


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
