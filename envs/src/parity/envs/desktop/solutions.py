"""Scripted solutions: play a task's "oracle" or "wrong" steps through the env's own step().

A step's optional `target` ({"name": ..., "tag": ...}) is looked up in the accessibility tree
at that moment and its centre becomes the action's x and y, so scripts survive layout changes.
A target not yet in the tree is looked for again for up to TARGET_WAIT_S: the tree can lag the
settled screen (a dialog's widgets, a page's links), as a person's eye waits for a button.
"""

from __future__ import annotations

import json
import time

from .env import DesktopEnv
from .tasks import SolutionError, resolve

TARGET_WAIT_S = 5.0


def play(env: DesktopEnv, task_id: str, which: str = "oracle",
         seed: int | None = None) -> tuple[float, list[dict[str, float]]]:
    """Reset to `task_id`, play its `which` solution, end with DONE.

    Returns (reward, timings): env.last_timing after the reset and after each step.
    """
    env.reset(seed=seed, options={"task_id": task_id})
    assert env.task is not None
    steps = [*env.task.solutions[which], {"action": "DONE"}]
    timings = [env.last_timing]
    for step in steps:
        action = resolve_when_shown(env, step)
        _, reward, terminated, truncated, info = env.step(json.dumps(action) if isinstance(action, dict) else action)
        timings.append(env.last_timing)
        if "error" in info:
            raise SolutionError(f"{task_id}/{which}: step {step} was rejected: {info['error']}")
        if terminated or truncated:
            return reward, timings
    raise SolutionError(f"{task_id}/{which}: the episode did not end")


def resolve_when_shown(env: DesktopEnv, step: dict) -> str | dict:
    """`resolve` on the env's current tree, looking again until the target shows or
    TARGET_WAIT_S passes (then SolutionError names the target and what the tree held)."""
    if "target" not in step:
        return resolve(step, [])
    deadline = time.monotonic() + TARGET_WAIT_S
    while True:
        try:
            return resolve(step, env.rows())
        except SolutionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
