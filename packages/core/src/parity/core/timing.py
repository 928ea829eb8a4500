"""Where wall time went: named time spans per actor, per step, episode and turn.

Every actor (learner, each rollout worker, the driver) records `Span`s into its own
`Timeline`; the trainer gathers them, sums them per step (`step_seconds`, `state_seconds`)
and writes one Chrome/Perfetto timeline (`parity.core.trace.chrome_trace`) with one track
per actor.

Span categories used across the project (a span's `cat`):
  gen           the engine generating tokens
  env           environment step: tool call, sandbox, observation tokenization
  reward        scoring a finished episode
  learner_fwd   learner forward passes (incl. the IS-statistics forwards)
  learner_bwd   learner backward passes
  optim         optimizer step (clip, AdamW, LR)
  checkpoint    writing a checkpoint (the driver's wait on the learner's write)
  sync          weight sync: learner -> object store -> workers
  learner_wait  the learner waiting for a full batch of groups
  episode       a whole episode (parent of its gen/env/reward spans)
  sandbox       the sandbox's share of one env step (its duration as the env measured it)
  state         one stretch of an actor's exclusive state (`StateClock`); named by state
  hold          a stretch during which the driver's lag bound held a worker back
  step          a training step's window on the driver (start to its metrics record)

Exclusive states (`StateClock`): an actor is in exactly one state at a time, so its state
spans tile its time and, clipped to the driver's step windows, add up to each step's wall
(`state_seconds`). The other categories are actor-seconds: concurrent episodes overlap.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CATEGORIES = (
    "gen", "env", "reward", "learner_fwd", "learner_bwd", "optim", "checkpoint", "sync",
    "learner_wait", "episode", "sandbox", "state", "hold", "step",
)

# The exclusive states (span names of category "state"). Learner:
FORWARD, BACKWARD, OPTIMIZER, D3_SPLIT = "forward", "backward", "optimizer", "D3 split"
LEARNER_OTHER = "other (collate, IS stats, version history)"
WAITING, PUBLISHING, CHECKPOINTING = "waiting for data", "publishing weights", "checkpointing"
COLLECTIVE = "waiting on collectives"  # a learner rank: its share done, the group's not
# rollout worker (PREFILL: an engine step computing any row of more than one token):
PREFILL, DECODE = "engine: prefill", "engine: decode"
# a vLLM worker sees only its requests, not the engine's steps: requests in flight
GENERATING = "engine: requests in flight (vLLM)"
ENV_WAIT = "waiting on envs"  # episodes in flight, the engine not stepping
HELD, LOADING, IDLE = "held by admission control", "loading weights", "idle"
UNRECORDED = "unrecorded"  # a step window's time no state span of the actor covers
STATE_ORDER = (FORWARD, BACKWARD, OPTIMIZER, D3_SPLIT, LEARNER_OTHER, PUBLISHING, CHECKPOINTING,
               WAITING, PREFILL, DECODE, GENERATING, ENV_WAIT, LOADING, HELD, IDLE, UNRECORDED,
               COLLECTIVE)  # last: the states before it keep their plot colours


@dataclass
class Span:
    """One timed interval.

    `track` is the actor that spent the time ("learner", "rollout-0", ...); `start` is
    wall-clock seconds since the epoch (time.time(), comparable across processes on one
    host); `dur` is seconds. `step` is the training step the time counts towards (-1: none
    yet), `episode` and `turn` identify the episode and turn where meaningful (-1 else);
    `args` holds anything else worth showing in the trace viewer.
    """

    name: str
    cat: str
    track: str
    start: float
    dur: float
    step: int = -1
    episode: str = ""
    turn: int = -1
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> float:
        return self.start + self.dur


class Timeline:
    """A thread-safe collector of spans for one actor (`track`)."""

    def __init__(self, track: str) -> None:
        self.track = track
        self.step = -1  # the step new spans count towards unless told otherwise
        self._spans: list[Span] = []
        self._lock = threading.Lock()

    def add(self, name: str, cat: str, start: float, dur: float, *, step: int | None = None,
            episode: str = "", turn: int = -1, **args: Any) -> Span:
        if cat not in CATEGORIES:
            raise ValueError(f"span {name!r}: unknown category {cat!r}; known: {CATEGORIES}")
        span = Span(name, cat, self.track, start, max(dur, 0.0),
                    self.step if step is None else step, episode, turn, args)
        with self._lock:
            self._spans.append(span)
        return span

    @contextmanager
    def span(self, name: str, cat: str, *, step: int | None = None, episode: str = "",
             turn: int = -1, **args: Any) -> Iterator[dict[str, Any]]:
        """Time the body; the yielded dict is added to the span's args (fill it in the body)."""
        extra: dict[str, Any] = {}
        t0 = time.time()
        try:
            yield extra
        finally:
            self.add(name, cat, t0, time.time() - t0, step=step, episode=episode, turn=turn,
                     **args, **extra)

    def drain(self) -> list[Span]:
        """Return and forget the spans collected so far (actors ship them to the trainer)."""
        with self._lock:
            out, self._spans = self._spans, []
        return out


class StateClock:
    """One actor's exclusive state: one current state at a time; the time between two
    transitions becomes a span (category `cat`, named by the state) on `timeline`. State
    None records nothing (e.g. a hold that is over)."""

    def __init__(self, timeline: Timeline, state: str | None, cat: str = "state") -> None:
        self.timeline = timeline
        self.cat = cat
        self.state = state
        self._since = time.time()
        self._lock = threading.Lock()  # engine steps and actor methods may run on threads

    def enter(self, state: str | None) -> str | None:
        """Switch to `state` (staying in the same state is no transition); returns the
        previous state."""
        with self._lock:
            prev = self.state
            if state != prev:
                self._close(time.time())
                self.state = state
            return prev

    @contextmanager
    def during(self, state: str) -> Iterator[None]:
        """`state` for the body, then back to the state current before it."""
        prev = self.enter(state)
        try:
            yield
        finally:
            self.enter(prev)

    def cut(self) -> None:
        """Record the current stretch up to now and go on in the same state (before the
        timeline is drained, so that a long stretch counts in the step it spans)."""
        with self._lock:
            self._close(time.time())

    def _close(self, now: float) -> None:
        if self.state is not None:
            self.timeline.add(self.state, self.cat, self._since, now - self._since)
        self._since = now


def step_seconds(spans: Iterable[Span]) -> dict[int, dict[str, float]]:
    """Seconds per category for each step: {step: {cat: seconds}} (`episode` spans excluded,
    since their children already count)."""
    out: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in spans:
        if s.cat != "episode":
            out[s.step][s.cat] += s.dur
    return {k: dict(v) for k, v in out.items()}


def state_seconds(spans: Iterable[Span]) -> dict[str, dict[int, dict[str, float]]]:
    """Per actor and step, the seconds of each exclusive state: {track: {step: {state: s}}}.

    The actor's state spans are clipped to the driver's step windows (category "step");
    within a worker's `IDLE` the driver's holds (category "hold") count as `HELD`; window
    time no state span covers is `UNRECORDED`. Each step's states add up to its wall."""
    spans = list(spans)
    windows = sorted((s.start, s.end, s.step) for s in spans if s.cat == "step")
    starts = [w[0] for w in windows]
    states: dict[str, list[Span]] = defaultdict(list)
    holds: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in spans:
        if s.cat == "state":
            states[s.track].append(s)
        elif s.cat == "hold":
            holds[s.track].append((s.start, s.end))
    out: dict[str, dict[int, dict[str, float]]] = {}
    for track, track_spans in sorted(states.items()):
        held = sorted(holds[track])
        secs: dict[int, dict[str, float]] = {step: defaultdict(float) for _, _, step in windows}
        for s in track_spans:
            i = max(bisect.bisect_right(starts, s.start) - 1, 0)
            while i < len(windows) and windows[i][0] < s.end:
                w0, w1, step = windows[i]
                lo, hi = max(w0, s.start), min(w1, s.end)
                if hi > lo:
                    h = _overlap(held, lo, hi) if s.name == IDLE else 0.0
                    secs[step][s.name] += hi - lo - h
                    if h:
                        secs[step][HELD] += h
                i += 1
        for w0, w1, step in windows:
            rest = (w1 - w0) - sum(secs[step].values())
            if rest > 0:
                secs[step][UNRECORDED] += rest
        out[track] = {step: dict(v) for step, v in secs.items()}
    return out


def _overlap(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi) covered by `intervals` (sorted, not overlapping each other)."""
    i = max(bisect.bisect_right(intervals, (lo, lo)) - 1, 0)
    total = 0.0
    while i < len(intervals) and intervals[i][0] < hi:
        total += max(0.0, min(hi, intervals[i][1]) - max(lo, intervals[i][0]))
        i += 1
    return total


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = q / 100 * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def slowest(spans: Iterable[Span], cat: str, n: int = 10) -> list[Span]:
    """The `n` longest spans of category `cat`, longest first."""
    return sorted((s for s in spans if s.cat == cat), key=lambda s: -s.dur)[:n]


def jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, str | int | float | bool) or v is None else str(v)
            for k, v in d.items()}


def write_spans(spans: Iterable[Span], path: str | Path) -> None:
    """Append spans to a JSON-lines file (the raw record `parity profile` reads)."""
    with open(path, "a") as f:
        for s in spans:
            f.write(json.dumps(asdict(s) | {"args": jsonable(s.args)}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_spans(path: str | Path) -> list[Span]:
    """Spans written by `write_spans`; a torn last line (crash mid-write) is skipped."""
    out: list[Span] = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            out.append(Span(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue
    return out
