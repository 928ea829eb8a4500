"""A rollout worker: a generation backend (the engine) plus an episode function (env
runner + sandbox pool), running groups of episodes concurrently on the newest weights.

The worker is a plain class; the fleet (parity.trainer.fleet) makes it a Ray actor. It is
generic over
  * `Backend`: anything with `version`, `async agenerate(prompt_ids, sampling) -> Completion`
    and `update_weights(state_dict, version)`, plain or async (the parity engine by default;
    parity.engine.vllm's with `rollout.engine = "vllm"`);
  * `EpisodeFn`: `async (generate, task_seed, sampling_seed) -> Trajectory` (the env
    runner by default): one episode of the task `task_seed`.

Weight updates: with `in_flight_updates` they apply at once, and episodes in progress
continue on the new weights (their tokens carry both versions). Without, the update waits
until the worker's episodes have finished, and new groups wait for the update.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from parity.core.timing import ENV_WAIT, IDLE, LOADING, Span, StateClock, Timeline
from parity.core.types import Completion, SamplingParams, Trajectory
from parity.envs.runner import Generate
from parity.trainer.config import TrainConfig

EpisodeFn = Callable[[Generate, int, int], Awaitable[Trajectory]]


class Backend(Protocol):
    version: int

    async def agenerate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion: ...

    def update_weights(self, state_dict: dict[str, Any], version: int) -> Any: ...


BackendFactory = Callable[[TrainConfig], Backend]
EpisodeFactory = Callable[[TrainConfig], EpisodeFn]


@dataclass
class GroupResult:
    """One prompt's G finished episodes, plus the worker's spans since its last report."""

    trajectories: list[Trajectory]
    spans: list[Span] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerSettings:
    """What a rollout worker reads of a run's config."""

    task_seed: int  # env.task_seed: group i plays task task_seed + i
    group_size: int  # rollout.group_size
    seed: int  # train.seed: the base of every episode's sampling seed
    in_flight_updates: bool  # rollout.in_flight_updates

    @classmethod
    def of(cls, cfg: TrainConfig) -> WorkerSettings:
        return cls(cfg.env.task_seed, cfg.rollout.group_size, cfg.train.seed,
                   cfg.rollout.in_flight_updates)


def group_seed(base: int, index: int, member: int) -> int:
    """The sampling seed of episode `member` of group `index` (reproducible on re-run)."""
    return (base * 1_000_003 + index * 1_009 + member) % (2**31)


class RolloutWorker:
    """Runs groups of episodes; see the module docstring."""

    def __init__(self, worker_id: int, cfg: WorkerSettings, make_backend: Callable[[], Backend],
                 make_episode: Callable[[], EpisodeFn]) -> None:
        self.id = worker_id
        self.cfg = cfg
        self.timeline = Timeline(f"rollout-{worker_id}")
        # the worker's exclusive state; building the backend loads the model
        self.clock = StateClock(self.timeline, LOADING)
        self.backend = make_backend()
        self.episode = make_episode()
        self.clock.enter(IDLE)
        if hasattr(self.backend, "state_clock"):  # the engine marks its prefill/decode steps
            self.backend.state_clock = self.clock
        self.timeline.step = self.backend.version
        self._active = 0
        self._drained = asyncio.Event()  # set while no episode is in flight
        self._drained.set()
        self._no_update_pending = asyncio.Event()
        self._no_update_pending.set()

    @property
    def version(self) -> int:
        return self.backend.version

    def node_probe(self, model_config: Any) -> dict[str, Any]:
        """The aligned kernels' fingerprint where this worker's tokens are computed
        (parity.trainer.nodes): its own process, or the vLLM worker running parity's decoder
        (vllm-aligned), which proved them on vLLM's torch build at start-up."""
        from parity.trainer.nodes import local_probe

        probe = local_probe(model_config)
        served = getattr(self.backend, "probe", None)
        return probe if served is None else {**probe, **served, "pid": f"{probe['pid']} (vLLM)"}

    def placement(self) -> dict[str, Any]:
        """Where this worker's process runs: Ray node, torch threads, CPU cores."""
        from parity.trainer.nodes import here

        return here()

    async def run_group(self, index: int) -> GroupResult:
        """Run the G episodes of group `index` (task seed = task_seed + index)."""
        await self._no_update_pending.wait()
        task_seed = self.cfg.task_seed + index
        with self._dies_with_backend():
            trajs = await asyncio.gather(*(
                self._episode(index, task_seed, m) for m in range(self.cfg.group_size)
            ))
        return GroupResult(list(trajs), self.timeline.drain())

    async def _episode(self, index: int, task_seed: int, member: int) -> Trajectory:
        self._enter()
        eid = f"g{index}-{member}"
        tl = self.timeline
        state = {"turn": 0, "last": time.time()}
        env_starts: list[float] = []  # per turn: when the env got the model's turn
        seed = group_seed(self.cfg.seed, index, member)

        async def generate(prompt_ids: list[int], sampling: SamplingParams) -> Completion:
            t0 = time.time()
            # the gap since the previous generation is the env's turn (tool, sandbox, obs)
            tl.add("env step", "env", state["last"], t0 - state["last"], episode=eid,
                   turn=state["turn"] - 1)
            c = await self.backend.agenerate(prompt_ids, sampling)
            state["last"] = time.time()
            env_starts.append(state["last"])
            tl.add("generate", "gen", t0, state["last"] - t0, episode=eid, turn=state["turn"],
                   tokens=len(c.token_ids), version=self.backend.version)
            state["turn"] += 1
            return c

        t_start = time.time()
        try:
            traj = await self.episode(generate, task_seed, seed)
        finally:
            self._leave()
        t_end = time.time()
        tl.add("env + reward", "reward", state["last"], t_end - state["last"], episode=eid,
               turn=state["turn"] - 1)
        tl.add(f"episode {eid}", "episode", t_start, t_end - t_start, episode=eid,
               reward=traj.reward, turns=traj.num_turns)
        # the env measured its sandbox time per turn (a duration); placed at the start of
        # that env step on the timeline's clock
        for t, timing in enumerate(traj.turn_timings[:len(env_starts)]):
            if timing.sandbox_s:
                tl.add("sandbox", "sandbox", env_starts[t], timing.sandbox_s, episode=eid, turn=t)
        return traj

    @contextlib.contextmanager
    def _dies_with_backend(self) -> Iterator[None]:
        """A backend whose own process died (a vLLM server) leaves this worker nothing to do:
        it dies too, and the fleet restarts it with a new backend."""
        try:
            yield
        except Exception:
            if not getattr(self.backend, "alive", True):
                self.backend.close()  # what is left of its processes
                os._exit(1)
            raise

    def _enter(self) -> None:
        if self._active == 0:
            self.clock.enter(ENV_WAIT)  # the engine's steps mark themselves within it
        self._active += 1
        self._drained.clear()

    def _leave(self) -> None:
        self._active -= 1
        if self._active == 0:
            self.clock.enter(IDLE)
            self._drained.set()

    async def update_weights(self, state_dict: dict[str, Any], version: int) -> int:
        """Load `state_dict` as policy `version`; returns the version now in use."""
        if version <= self.backend.version:
            return self.backend.version
        if not self.cfg.in_flight_updates:
            self._no_update_pending.clear()
            await self._drained.wait()
        with (self.clock.during(LOADING), self._dies_with_backend(),
              self.timeline.span("update weights", "sync", version=version)):
            loading = self.backend.update_weights(state_dict, version)
            if inspect.isawaitable(loading):  # a backend in another process (vLLM)
                await loading
        self.timeline.step = version
        self._no_update_pending.set()
        return version

    def drain_spans(self) -> list[Span]:
        """The spans so far; the current state's stretch is reported up to now, so that
        e.g. idle time counts towards the step in which it happened."""
        self.clock.cut()
        return self.timeline.drain()

    def ping(self) -> int:
        return self.id
