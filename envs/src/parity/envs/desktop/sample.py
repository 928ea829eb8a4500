"""The tasks CI plays on each backend: a fixed sample that uses every application, getter and
metric of the shipped tasks at least once (oracle and wrong solution locally, the oracle on
docker).

Playing every task's oracle and wrong solution on both backends is the job of `parity bench
desktop` and of the tests marked `desktop_full` (not run by default). A test checks that
`CI_SAMPLE` still covers what `features` finds in every shipped task: a new task that brings
an app, getter or metric of its own must add itself (or another task using it) here.
"""

from __future__ import annotations

from .evaluators import funcs_of
from .tasks import Task

CI_SAMPLE = (
    "browser-open-address", "browser-bookmark-page", "browser-order-form",
    "calc-fix-cell",
    "writer-center-title", "writer-append-paragraph", "writer-page-break",
    "impress-delete-slide",
    "pcmanfm-delete",
    "mousepad-append-line",
    "terminal-count-lines",
    "textedit-open-file",
    "files-delete",
    "settings-dark-mode", "settings-user-name",
    "sheet-sum-formula",
    "gimp-flip-horizontal", "gimp-scale-image", "gimp-invert-colors", "gimp-export-jpeg",
    "vlc-minimal-view", "vlc-one-instance-off", "vlc-recordings-folder", "vlc-dark-palette",
    "thunderbird-filter-mark-read",
    "chromium-follow-link", "chromium-bookmark-page",
)
"""Task ids, chosen greedily: each adds an app, getter or metric the ones before it lack; among
equals, the one with the fewest oracle steps."""


def features(task: Task) -> set[tuple[str, str]]:
    """("app", name), ("getter", type) and ("metric", name) for everything the task uses."""
    found = {("app", app) for app in task.related_apps} | {("metric", f) for f in funcs_of(task.evaluator)}
    for key in ("result", "expected"):
        getters = task.evaluator.get(key)
        for g in getters if isinstance(getters, list) else [getters]:
            if isinstance(g, dict):
                found.add(("getter", g["type"]))
    return found


def uncovered(tasks: list[Task], sample: tuple[str, ...] = CI_SAMPLE) -> dict[tuple[str, str], list[str]]:
    """What some task uses and no task of `sample` does → the tasks that use it."""
    covered = set().union(*(features(t) for t in tasks if t.id in sample))
    missing: dict[tuple[str, str], list[str]] = {}
    for t in tasks:
        for feature in sorted(features(t) - covered):
            missing.setdefault(feature, []).append(t.id)
    return missing
