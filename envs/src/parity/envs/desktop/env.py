"""`parity/Desktop-v0`: OSWorld-style computer-use tasks on a real X desktop in a sandbox.

Observations (a dict; which keys depends on `obs_mode`):
    instruction          the task's instruction
    feedback             "" or what went wrong with the last action ("error: ...")
    accessibility_tree   the linearised tree (modes "a11y_tree", "screenshot_a11y_tree")
    screenshot           (height, width, 3) uint8 (modes "screenshot", "screenshot_a11y_tree",
                         and "som", where it carries numbered boxes over the marks)
    marks                the set-of-marks table (mode "som"; see `marks`)
Actions: text (or a dict): computer_13 JSON, a pyautogui-call subset, or WAIT / DONE / FAIL;
see `actions`. In "som" mode an action may name a mark of the last observation (tag_N); a
mark whose element is no longer on screen is refused with feedback. An invalid action costs a step and returns feedback, never an exception.
Reward: the task's evaluator score in [0, 1], given once when the episode ends (DONE, FAIL,
or `max_steps`). If the desktop dies (X server, sandbox), the episode terminates with reward 0
and `info["failure"]`; the next reset starts a fresh sandbox. A reset whose real app shows no
accessibility tree (AT-SPI lost it) replaces the desktop once, then raises DesktopDeadError.
`env.last_timing` after each step holds parse_s, action_s, settle_s, screenshot_s, tree_s,
eval_s, overhead_s (the rest: HTTP round trips, Python between the phases) and step_s, their
sum (seconds); after reset it holds sandbox_s, reset_s, setup_s, screenshot_s,
tree_s. (Not in `info`: gymnasium's checker requires info to be deterministic.)
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from . import a11y, marks
from .actions import ActionParseError, parse
from .client import DesktopClient, DesktopDeadError, DesktopRequestError
from .evaluators import evaluate
from .getters import EvalContext
from .sandbox import DesktopLimits, DesktopSandbox
from .steps import run_step
from .tasks import Task, guest_steps, load_tasks, resolve

OBS_MODES = ("a11y_tree", "screenshot", "screenshot_a11y_tree", "som")
MAX_TEXT = 65536
EVAL_SETTLE_S = 20.0
"""How long evaluation waits at most for the desktop to go idle (a loaded machine saves slowly)."""
TREE_SETTLE_S, TREE_POLL_S, TREE_WAIT_S = 5.0, 0.2, 20.0
"""At reset the tree is read until two reads `TREE_POLL_S` apart agree, for at most
`TREE_SETTLE_S`: Firefox builds a page's accessible objects only when first asked, after its
screen has gone still, and a reset must return the same observation for the same task. A
`TREE_APPS` app's rows are waited for up to `TREE_WAIT_S`: on a loaded machine GIMP's window
showed before its tree, and two equal reads without it are not yet settled."""
TREE_APPS = frozenset({"libreoffice_calc", "libreoffice_writer", "pcmanfm", "firefox", "mousepad", "gimp", "vlc",
                       "thunderbird", "chromium"})
"""Real apps that export their widgets through AT-SPI: a reset whose task's first app is one of
them and whose tree has no AT-SPI row has lost the desktop's tree (the registry died or forgot
its apps), and the desktop is replaced. Not Impress: its first window is drawn before its tree
is filled in."""


def _close(timing: dict[str, float], t0: float) -> None:
    """Set a step's `step_s` (its wall time since `t0`) and `overhead_s`, the part no phase
    measured (HTTP round trips, Python between phases), so that the phases sum to the step."""
    timing["step_s"] = time.monotonic() - t0
    timing["overhead_s"] = timing["step_s"] - sum(v for k, v in timing.items() if k not in ("step_s", "overhead_s"))


class DesktopEnv(gym.Env):
    """One desktop (one sandbox), reused across episodes and reset in place between them."""

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, tasks: list[Task] | None = None, backend: str = "auto", obs_mode: str = "a11y_tree",
                 max_steps: int = 15, a11y_max_tokens: int = 2000,
                 limits: DesktopLimits | None = None, fixed_sleep_s: float | None = None,
                 task_dir: str | Path | None = None) -> None:
        """`backend`: "docker", "local" (bubblewrap) or "auto" (docker where an engine answers and
        the image from scripts/build_desktop_image.sh exists, else local); chosen at the first
        reset. `fixed_sleep_s`: sleep this long after each action instead of waiting for the
        screen to settle (OSWorld's fixed sleep; for comparisons only). `task_dir`: a folder of
        OSWorld-format task JSON files (shipped files in its `files/`) to use instead of the
        built-in tasks; a task that cannot be used raises TaskError (a ValueError) here."""
        limits = limits or DesktopLimits()
        if obs_mode not in OBS_MODES:
            raise ValueError(f"obs_mode must be one of {OBS_MODES}, got {obs_mode!r}")
        if tasks is not None and task_dir is not None:
            raise ValueError("give tasks or task_dir, not both")
        self.tasks = tasks if tasks is not None else load_tasks(task_dir) if task_dir is not None else load_tasks()
        if not self.tasks:
            raise ValueError("DesktopEnv needs at least one task")
        self.backend, self.obs_mode, self.max_steps = backend, obs_mode, max_steps
        self.a11y_max_tokens, self.limits, self.fixed_sleep_s = a11y_max_tokens, limits, fixed_sleep_s
        text = spaces.Text(max_length=MAX_TEXT, charset=frozenset(a11y.PRINTABLE), min_length=0)
        obs: dict[str, spaces.Space] = {"instruction": text, "feedback": text}
        if "a11y" in obs_mode:
            obs["accessibility_tree"] = text
        if "screenshot" in obs_mode or obs_mode == "som":
            obs["screenshot"] = spaces.Box(0, 255, (limits.height, limits.width, 3), np.uint8)
        if obs_mode == "som":
            obs["marks"] = text
        self.observation_space = spaces.Dict(obs)
        self.action_space = spaces.Text(max_length=4096, charset=frozenset(a11y.PRINTABLE), min_length=0)
        self.sandbox: DesktopSandbox | None = None
        self.client: DesktopClient | None = None
        self.atspi = False  # whether the desktop runs AT-SPI (real apps' trees)
        self.task: Task | None = None
        self.steps = 0
        self.done = True
        self.last_timing: dict[str, float] = {}
        self.marks: list[dict] = []  # the last observation's set-of-marks (mode "som")

    # --- lifecycle -------------------------------------------------------------------------

    def _fresh_desktop(self) -> None:
        self._drop_desktop()
        self.sandbox = DesktopSandbox(self.backend, self.limits)
        self.client = DesktopClient(self.sandbox.socket)
        self.atspi = bool(self.client.health().get("atspi"))

    def _drop_desktop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.sandbox is not None:
            self.sandbox.close()
        self.sandbox = self.client = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Start (or reset) the desktop and set up a task: `options["task_id"]`, else one drawn by seed."""
        super().reset(seed=seed)
        options = options or {}
        if "task_id" in options:
            matches = [t for t in self.tasks if t.id == options["task_id"]]
            if not matches:
                raise ValueError(f"unknown task_id {options['task_id']!r}")
            self.task = matches[0]
        else:
            self.task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        for attempt in (1, 2):  # a desktop that dies during setup is replaced once
            try:
                obs, timing = self._start_episode()
                break
            except DesktopDeadError:
                self._drop_desktop()
                if attempt == 2:
                    raise
        self.steps, self.done = 0, False
        self.last_timing = timing
        return obs, {"task_id": self.task.id}

    def _start_episode(self) -> tuple[dict, dict[str, float]]:
        """Reset the desktop in place (or start a sandbox), run the task's config, observe."""
        assert self.task is not None
        timing = {"sandbox_s": 0.0, "reset_s": 0.0}
        start = time.monotonic()
        if self.sandbox is not None and self.sandbox.running():
            try:
                self.client.reset()  # type: ignore[union-attr]
            except DesktopDeadError:
                self._drop_desktop()
        else:
            self._drop_desktop()
        timing["reset_s"] = time.monotonic() - start
        if self.sandbox is None:
            start = time.monotonic()
            self._fresh_desktop()
            timing["sandbox_s"] = time.monotonic() - start
        start = time.monotonic()
        for i, step in enumerate(guest_steps(self.task)):
            try:
                run_step(self.client, step, self.limits.width, self.limits.height)  # type: ignore[arg-type]
            except DesktopRequestError as e:
                raise RuntimeError(f"task {self.task.id}: config[{i}] ({step.get('type')}) failed: {e}") from e
        timing["setup_s"] = time.monotonic() - start
        return self._observe("", timing, settle_tree=True), timing

    def step(self, action: str | dict) -> tuple[dict, float, bool, bool, dict]:
        """Perform one action; the episode ends on DONE/FAIL, after max_steps, or if the desktop dies."""
        if self.done or self.task is None or self.client is None:
            raise RuntimeError("call reset() before step()")
        self.steps += 1
        t0 = time.monotonic()
        timing = {"parse_s": 0.0, "action_s": 0.0, "settle_s": 0.0, "eval_s": 0.0}
        feedback, last = "", None
        try:
            act = parse(action, self.limits.width, self.limits.height, self.marks)
            if act.marks:
                self._check_marks(act.marks)
            timing["parse_s"] = time.monotonic() - t0
            if act.kind == "wait":
                act = type(act)("ops", [{"op": "wait", "seconds": act.seconds}])
            for op in act.ops:
                if self.fixed_sleep_s is not None:
                    op = {**op, "fixed_sleep_s": self.fixed_sleep_s}
                done = self.client.action(op)
                timing["action_s"] += done["action_s"]
                timing["settle_s"] += done["settle_s"]
            last = act.kind if act.kind in ("done", "fail") else None
        except (ActionParseError, DesktopRequestError) as e:
            feedback = f"error: {e}"
        except DesktopDeadError as e:
            return self._fail(str(e), timing, t0)
        terminated = last is not None
        truncated = not terminated and self.steps >= self.max_steps
        reward = 0.0
        info: dict[str, Any] = {"task_id": self.task.id}
        self.last_timing = timing
        if feedback:
            info["error"] = feedback
        try:
            if terminated or truncated:
                start = time.monotonic()
                reward = self.evaluate(last)
                timing["eval_s"] = time.monotonic() - start
                self.done = True
            obs = self._observe(feedback, timing)
        except DesktopDeadError as e:
            return self._fail(str(e), timing, t0)
        _close(timing, t0)
        return obs, reward, terminated, truncated, info

    def _check_marks(self, used: tuple[int, ...]) -> None:
        """Refuse an action on a mark whose element has gone or moved since the observation."""
        assert self.client is not None
        now = marks.marks_of(self.client.accessibility())
        for n in used:
            was = self.marks[n - 1]
            if not any(marks.same_element(was, row) for row in now):
                raise ActionParseError(f"mark {n} ({was['tag']} {was['name']!r}) is no longer on screen; "
                                       "nothing was done")

    def evaluate(self, last_action: str | None) -> float:
        """The current task's evaluator score, once the desktop is idle (an app may still be
        saving the file), with files copied out of the desktop into a temporary folder that is
        removed afterwards. Raises DesktopDeadError if the desktop died."""
        if self.client is None or self.task is None:
            raise RuntimeError("call reset() first")
        self.client.setup({"type": "settle", "parameters": {"timeout": EVAL_SETTLE_S}})
        with tempfile.TemporaryDirectory(prefix="parity-eval-") as cache:
            ctx = EvalContext(self.client, Path(cache), self.task.files_dir, self.limits.width, self.limits.height)
            return evaluate(ctx, self.task.evaluator, last_action)

    def oracle_action(self) -> str:
        """The task's scripted oracle step for the current step (then DONE), its target
        resolved against the accessibility tree: what `parity envs check` plays."""
        if self.done or self.task is None:
            raise RuntimeError("oracle_action() needs a running episode; call reset() first")
        steps = [*self.task.solutions.get("oracle", []), {"action": "DONE"}]
        step = steps[min(self.steps, len(steps) - 1)]
        action = resolve(step, self.rows() if "target" in step else [])
        return json.dumps(action) if isinstance(action, dict) else action

    def _fail(self, reason: str, timing: dict, t0: float) -> tuple[dict, float, bool, bool, dict]:
        """End the episode because the desktop died; the next reset starts a fresh one."""
        log = self.sandbox.log_tail(500) if self.sandbox is not None else ""
        self._drop_desktop()
        self.done = True
        _close(timing, t0)
        self.last_timing = timing
        obs = self._blank(f"error: the desktop failed: {reason}")
        return obs, 0.0, True, False, {"task_id": self.task.id if self.task else None,
                                       "failure": reason, "error": obs["feedback"], "log_tail": log}

    def close(self) -> None:
        self._drop_desktop()

    # --- observations ----------------------------------------------------------------------

    def _observe(self, feedback: str, timing: dict, settle_tree: bool = False) -> dict:
        assert self.client is not None and self.task is not None
        obs: dict[str, Any] = {"instruction": a11y.clean(self.task.instruction),
                               "feedback": a11y.clean(feedback)[:MAX_TEXT]}
        rows = self._rows(timing, settle_tree) if "a11y" in self.obs_mode or self.obs_mode == "som" else []
        if "a11y" in self.obs_mode:
            obs["accessibility_tree"] = a11y.linearize(rows, self.a11y_max_tokens)[:MAX_TEXT]
        if "screenshot" in self.obs_mode or self.obs_mode == "som":
            obs["screenshot"] = self.client.screenshot()
            timing["screenshot_s"] = self.client.last_s
        if self.obs_mode == "som":
            start = time.monotonic()
            self.marks = marks.marks_of(rows)
            obs["screenshot"] = marks.draw(obs["screenshot"], self.marks)
            obs["marks"] = marks.table(self.marks)[:MAX_TEXT]
            timing["marks_s"] = time.monotonic() - start
        return obs

    def _rows(self, timing: dict, settle: bool) -> list[dict]:
        """The accessibility rows; with `settle` (at reset), the first that two reads in a row
        agree on, and a DesktopDeadError if the task's app has lost its tree."""
        assert self.client is not None and self.task is not None
        start = time.monotonic()
        app = self.task.related_apps[0] if self.task.related_apps else None
        needs_tree = settle and self.atspi and app in TREE_APPS

        def settled(rows: list[dict]) -> bool:
            return not needs_tree or any(r["class"] == "atspi" for r in rows)

        rows = self.client.accessibility()
        while settle and time.monotonic() - start < (TREE_SETTLE_S if settled(rows) else TREE_WAIT_S):
            time.sleep(TREE_POLL_S)
            rows, last = self.client.accessibility(), rows
            if rows == last and settled(rows):
                break
        timing["tree_s"] = time.monotonic() - start
        if not settled(rows):
            raise DesktopDeadError(f"task {self.task.id}: {app}'s window has no accessibility tree "
                                   "(AT-SPI answers for none of it)")
        return rows

    def _blank(self, feedback: str) -> dict:
        assert self.task is not None
        obs: dict[str, Any] = {"instruction": a11y.clean(self.task.instruction), "feedback": a11y.clean(feedback)}
        if "a11y" in self.obs_mode:
            obs["accessibility_tree"] = ""
        if "screenshot" in self.obs_mode or self.obs_mode == "som":
            obs["screenshot"] = np.zeros((self.limits.height, self.limits.width, 3), np.uint8)
        if self.obs_mode == "som":
            self.marks, obs["marks"] = [], ""
        return obs

    def rows(self) -> list[dict]:
        """The current accessibility rows (for scripted solutions and debugging)."""
        if self.client is None:
            raise RuntimeError("call reset() first")
        return self.client.accessibility()
