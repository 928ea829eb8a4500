"""`parity/DesktopText-v0`: the desktop as a token-in-token-out chat env for text-only models.

A thin `TextEnv` over `DesktopEnv` in "a11y_tree" mode: the prompt is the instruction plus the
linearised accessibility tree; each model turn is one action (computer_13 JSON, pyautogui
calls, WAIT/DONE/FAIL, optionally in a ``` fence); the observation is the feedback and the new
tree. The reward is the task's evaluator score: from the desktop when the desktop episode
ended (DONE, FAIL, desktop failure), else evaluated on the spot (max_turns, max_tokens, timeout).
The desktop itself is reused across episodes and closed with the env.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import numpy as np

from parity.envs.core import Response, TextEnv
from parity.envs.data import Task
from parity.envs.episode import EpisodeLimits, Message
from parity.envs.rubric import Criterion, Rubric

from .env import DesktopEnv

SYSTEM = (
    "You control a Linux desktop. Each turn, answer with exactly one action: a computer_13 JSON "
    'object such as {"action_type": "CLICK", "parameters": {"x": 10, "y": 20}}, or pyautogui calls '
    "such as pyautogui.typewrite('hi'), or WAIT, DONE (task finished) or FAIL (task impossible). "
    "Positions in the accessibility table are the top-left corners of widgets."
)


class DesktopTextEnv(TextEnv):
    """OSWorld-style desktop tasks as a multi-turn chat over the accessibility tree."""

    required_fields = ("task_id",)
    field_types: ClassVar[dict[str, tuple[type, ...]]] = {"task_id": (str,)}

    def __init__(self, *, backend: str = "auto", a11y_max_tokens: int = 2000, task_dir: str | None = None,
                 limits: EpisodeLimits | dict | None = None, **kwargs: Any) -> None:
        """`backend`, `a11y_max_tokens`, `task_dir`: as for DesktopEnv. Other arguments go to TextEnv."""
        super().__init__(limits=limits or EpisodeLimits(max_turns=15, max_tokens=32768, timeout_s=600.0),
                         **kwargs)
        self.desktop = DesktopEnv(backend=backend, obs_mode="a11y_tree", max_steps=10**6,
                                  a11y_max_tokens=a11y_max_tokens, task_dir=task_dir)
        self.rubric = Rubric([Criterion(self._task_score, 1.0, "task_score")])
        self._reward: float | None = None

    def generate_task(self, rng: np.random.Generator) -> Task:
        return {"task_id": self.desktop.tasks[int(rng.integers(len(self.desktop.tasks)))].id}

    def prompt_messages(self, task: Task) -> list[Message]:
        # Blocking (≈0.5 s): areset calls this hook synchronously.
        obs, _ = self.desktop.reset(options={"task_id": task["task_id"]})
        self._reward = None
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{obs['instruction']}\n\n{obs['accessibility_tree']}"}]

    async def respond(self, text: str) -> Response:
        obs, reward, terminated, truncated, info = await asyncio.to_thread(self.desktop.step, text)
        timing = self.desktop.last_timing
        metrics = {"parse_errors": 1.0} if "error" in info and "failure" not in info else {}
        if terminated or truncated:
            self._reward = reward
            return Response(done=True, reason="desktop_failed" if "failure" in info else "done",
                            failure="sandbox" if "failure" in info else None,
                            metrics=metrics, sandbox_s=timing.get("step_s", 0.0))
        content = f"{obs['feedback']}\n\n{obs['accessibility_tree']}" if obs["feedback"] else obs["accessibility_tree"]
        return Response(messages=[{"role": "user", "content": content}], metrics=metrics,
                        sandbox_s=timing.get("step_s", 0.0))

    def oracle(self) -> str:
        """The task's scripted oracle step for this turn (then DONE): one chat turn is one
        desktop step."""
        return self.desktop.oracle_action()

    async def _task_score(self, _episode: Any) -> float:
        if self._reward is not None:
            return self._reward
        desktop = self.desktop
        if desktop.client is None or desktop.task is None:
            return 0.0
        return await asyncio.to_thread(desktop.evaluate, None)

    def close(self) -> None:
        super().close()
        self.desktop.close()
