"""Admission: which rollout group starts next and on which worker, and which groups each
step trains on. Bookkeeping only: no Ray, no I/O.

Groups are numbered 0, 1, 2, … in the order they are started (group g runs the task
`env.task_seed + g`); the learner consumes them in index order, n = `groups_per_step` per
step, whatever order they finish in. A group's slot is its place in that order: its index
minus the dropped groups below it, so step s trains on slots [s·n, (s+1)·n). The lag bound
starts a group on a worker holding weights version v only if its slot < (v + max_lag + 1)·n,
so every token of it was sampled by a version ≥ s − max_lag: staleness is bounded without
dropping finished work (workers simply get no new group when too far ahead). Sync mode is
max_lag 0. A dropped group is replaced by the next index; groups whose worker died run again
before any new one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from parity.core.types import Trajectory
from parity.trainer.config import TrainConfig
from parity.trainer.errors import RunStopped
from parity.trainer.failures import describe, too_few_left, usable


@dataclass(frozen=True)
class AdmissionSettings:
    """What admission reads of a run's config."""

    groups_per_step: int  # rollout.groups_per_step: n
    steps: int  # train.steps
    max_lag: int  # the lag bound (0 in sync mode)
    max_in_flight: int  # rollout.max_groups_in_flight: groups at once on one worker
    min_group_episodes: int  # train.min_group_episodes
    max_dropped_in_a_row: int  # train.max_dropped_in_a_row

    @classmethod
    def of(cls, cfg: TrainConfig) -> AdmissionSettings:
        return cls(cfg.rollout.groups_per_step, cfg.train.steps, cfg.max_lag,
                   cfg.rollout.max_groups_in_flight, cfg.train.min_group_episodes,
                   cfg.train.max_dropped_in_a_row)


@dataclass
class AdmissionState:
    """What a checkpoint keeps of admission. `cursor`: the next new group index; `consumed`:
    the groups below it are trained on or dropped; `dropped`: group -> reason (the exception
    its episode code raised, or "env_failures"); `done`: the finished groups not yet consumed,
    dropped ones included. A group in [consumed, cursor) in neither `done` nor `dropped` was
    unfinished: it runs again."""

    cursor: int = 0
    consumed: int = 0
    dropped: dict[int, str] = field(default_factory=dict)
    done: dict[int, list[Trajectory]] = field(default_factory=dict)


@dataclass(frozen=True)
class Batch:
    """One step's consumed groups: `groups`, what it trains on (each group's usable
    episodes, in index order); `episodes`, every episode of every group it consumed,
    trained on or dropped."""

    groups: list[list[Trajectory]]
    episodes: list[Trajectory]


class Admission:
    """Admission control over group indices; see the module docstring."""

    def __init__(self, settings: AdmissionSettings, state: AdmissionState | None = None) -> None:
        self.settings = settings
        self.state = state or AdmissionState()
        s = self.state
        self.retry = [g for g in range(s.consumed, s.cursor)  # to run again, oldest first
                      if g not in s.done and g not in s.dropped]
        self.dropped_in_a_row = 0

    def pending(self) -> int | None:
        """The group to start next: one to run again first, else the next new index; None
        when every group the run needs has started (steps·n, plus one per dropped group)."""
        n, s = self.settings.groups_per_step, self.state
        g = self.retry[0] if self.retry else s.cursor
        return g if g < self.settings.steps * n + len(s.dropped) else None

    def admits(self, g: int, version: int) -> bool:
        """The lag bound: whether a worker holding weights `version` may start group g."""
        slot = g - sum(1 for d in self.state.dropped if d < g)
        return slot < (version + self.settings.max_lag + 1) * self.settings.groups_per_step

    def place(self, load: list[int], versions: list[int]) -> tuple[int, int] | None:
        """(group, worker): the pending group and where it starts, counted as started: of
        the workers with room (`load`: each worker's groups in flight) whose weights version
        (`versions`) admits it, the least loaded, the lowest index among equals. None when no
        group is pending or no worker may start it."""
        g = self.pending()
        if g is None:
            return None
        ok = [w for w, k in enumerate(load)
              if k < self.settings.max_in_flight and self.admits(g, versions[w])]
        if not ok:
            return None
        w = min(ok, key=lambda w: (load[w], w))
        if self.retry:
            self.retry.pop(0)
        else:
            self.state.cursor += 1
        return g, w

    def held(self, load: list[int]) -> set[int]:
        """The workers the lag bound holds back once `place` has returned None: while a group
        is pending, every worker with room."""
        if self.pending() is None:
            return set()
        return {w for w, k in enumerate(load) if k < self.settings.max_in_flight}

    def rerun(self, groups: Iterable[int]) -> None:
        """Groups whose worker died: they run again before any new group, oldest first."""
        self.retry = sorted(set(self.retry) | set(groups))

    def finished(self, g: int, trajectories: list[Trajectory]) -> str | None:
        """Record group g's episodes. Returns why it must be dropped when too few of them
        did not fail (parity.trainer.failures); None when it trains."""
        self.state.done[g] = trajectories
        limit = self.settings.min_group_episodes
        if too_few_left(trajectories, limit):
            return (f"{describe(trajectories)}, fewer than train.min_group_episodes = {limit} "
                    f"left")
        self.dropped_in_a_row = 0
        return None

    def drop(self, g: int, reason: str, cause: str) -> None:
        """Drop group g (`reason`: the exception its episode code raised, or
        "env_failures"); RunStopped after `max_dropped_in_a_row` in a row."""
        self.state.dropped[g] = reason
        self.dropped_in_a_row += 1
        limit = self.settings.max_dropped_in_a_row
        if self.dropped_in_a_row >= limit:
            raise RunStopped(f"{self.dropped_in_a_row} groups in a row were dropped "
                             f"(train.max_dropped_in_a_row = {limit}); the last: {cause}")

    def next_groups(self) -> list[int]:
        """The indices of the n groups the next step trains on."""
        out, g = [], self.state.consumed
        while len(out) < self.settings.groups_per_step:
            if g not in self.state.dropped:
                out.append(g)
            g += 1
        return out

    def batch_ready(self) -> bool:
        """Whether every group of the next step has finished."""
        return all(g in self.state.done for g in self.next_groups())

    def take(self) -> Batch:
        """Consume the next step's groups (`batch_ready`) and every finished group below the
        last of them: the dropped ones."""
        s = self.state
        need = self.next_groups()
        finished = {g: s.done.pop(g) for g in range(s.consumed, need[-1] + 1) if g in s.done}
        s.consumed = need[-1] + 1
        return Batch([usable(finished[g]) for g in need],
                     [t for group in finished.values() for t in group])

    def saved(self) -> AdmissionState:
        """A copy of the state, for a checkpoint."""
        s = self.state
        return AdmissionState(s.cursor, s.consumed, dict(s.dropped), dict(s.done))
