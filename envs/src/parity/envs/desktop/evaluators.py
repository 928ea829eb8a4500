"""OSWorld-style evaluation: getters read the desktop's state, metrics score it, `evaluate` combines.

An evaluator is {"func": name or [names], "conj": "and"|"or", "result": getter or [getters],
"expected": getter or [getters], "options": {} or [{}], "postconfig": [setup steps]}, as in
OSWorld: `postconfig` runs first (setup steps, e.g. activate a window or a pyautogui script
that saves the file; see `steps`), then each func gets its
result and expected values (`getters`) and scores them (`metrics`); `conj` "and" is the
minimum, "or" the maximum. A getter that cannot read its state scores 0, it does not raise.
"""

from __future__ import annotations

from typing import Any

from .client import DesktopRequestError
from .getters import EvalContext
from .steps import run_step, setup_steps
from .vocabulary import GETTERS, METRICS


def _as_list(value: Any, n: int) -> list:
    return value if isinstance(value, list) else [value] * n


def funcs_of(evaluator: dict) -> list[str]:
    """The evaluator's metric names as a list."""
    return evaluator["func"] if isinstance(evaluator["func"], list) else [evaluator["func"]]


def evaluate(ctx: EvalContext, evaluator: dict, last_action: str | None) -> float:
    """Score the episode in [0, 1]. `last_action` is "done", "fail" or None (ran out of steps).

    The metric "infeasible" scores 1 exactly when the agent answered FAIL; any other task
    answered with FAIL scores 0.
    """
    funcs = funcs_of(evaluator)
    if funcs == ["infeasible"]:
        return float(last_action == "fail")
    if last_action == "fail":
        return 0.0
    try:
        for step in setup_steps(evaluator.get("postconfig", []), ctx.files_dir):
            run_step(ctx.client, step, ctx.width, ctx.height)
    except DesktopRequestError:
        return 0.0
    n = len(funcs)
    results = _as_list(evaluator.get("result"), n)
    expected = _as_list(evaluator.get("expected"), n)
    options = _as_list(evaluator.get("options", {}), n)
    scores = []
    for func, res, exp, opt in zip(funcs, results, expected, options, strict=True):
        try:
            got = GETTERS[res["type"]](ctx, res)
            want = GETTERS[exp["type"]](ctx, exp) if exp is not None else None
        except DesktopRequestError:
            scores.append(0.0)  # unreadable state never matches
            continue
        args = (got,) if exp is None else (got, want)
        scores.append(float(METRICS[func](*args, **opt)))
    return min(scores) if evaluator.get("conj", "and") == "and" else max(scores)
