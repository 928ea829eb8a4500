"""Where wall time went: named time spans per actor, per step, episode and turn.

Every actor (learner, each rollout worker, the driver) records `Span`s into its own
`Timeline`; the trainer gathers them, sums them per step (`breakdown`) and writes one
Chrome/Perfetto timeline (`chrome_trace`) with one track per actor.

Span categories used across the project (a span's `cat`):
  gen           the engine generating tokens
  env           environment step: tool call, sandbox, observation tokenization
  reward        scoring a finished episode
  learner_fwd   learner forward passes (incl. the IS-statistics forwards)
  learner_bwd   learner backward passes
  optim         optimizer step (clip, AdamW, LR)
  sync          weight sync: learner -> object store -> workers
  learner_wait  the learner waiting for a full batch of groups
  rollout_idle  a rollout worker with no episode in flight
  episode       a whole episode (parent of its gen/env/reward spans)
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CATEGORIES = (
    "gen", "env", "reward", "learner_fwd", "learner_bwd", "optim", "sync",
    "learner_wait", "rollout_idle", "episode",
)


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


def step_seconds(spans: Iterable[Span]) -> dict[int, dict[str, float]]:
    """Seconds per category for each step: {step: {cat: seconds}} (`episode` spans excluded,
    since their children already count)."""
    out: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in spans:
        if s.cat != "episode":
            out[s.step][s.cat] += s.dur
    return {k: dict(v) for k, v in out.items()}


def slowest(spans: Iterable[Span], cat: str, n: int = 10) -> list[Span]:
    """The `n` longest spans of category `cat`, longest first."""
    return sorted((s for s in spans if s.cat == cat), key=lambda s: -s.dur)[:n]


def chrome_trace(spans: Iterable[Span]) -> dict[str, Any]:
    """A Chrome/Perfetto trace (JSON object format): one process row per track, complete
    ("X") events in microseconds relative to the earliest span."""
    spans = sorted(spans, key=lambda s: s.start)
    t0 = spans[0].start if spans else 0.0
    tracks = sorted({s.track for s in spans}, key=_track_order)
    pid = {t: i + 1 for i, t in enumerate(tracks)}
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid[t], "tid": 0, "args": {"name": t}}
        for t in tracks
    ]
    events += [
        {"ph": "M", "name": "process_sort_index", "pid": pid[t], "tid": 0,
         "args": {"sort_index": pid[t]}}
        for t in tracks
    ]
    for s in spans:
        args = {"step": s.step, **({"episode": s.episode} if s.episode else {}),
                **({"turn": s.turn} if s.turn >= 0 else {}), **s.args}
        # Episodes overlap on a worker (continuous batching): give each its own thread row.
        tid = (zlib.crc32(s.episode.encode()) % 10_000 + 1) if s.episode else 0
        events.append({
            "ph": "X", "name": s.name, "cat": s.cat, "pid": pid[s.track], "tid": tid,
            "ts": round((s.start - t0) * 1e6, 1), "dur": round(s.dur * 1e6, 1),
            "args": _jsonable(args),
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _track_order(track: str) -> tuple[int, str]:
    order = {"driver": 0, "learner": 1}
    return (order.get(track, 2), track)


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, str | int | float | bool) or v is None else str(v)
            for k, v in d.items()}


def write_spans(spans: Iterable[Span], path: str | Path) -> None:
    """Append spans to a JSON-lines file (the raw record `parity profile` reads)."""
    with open(path, "a") as f:
        for s in spans:
            f.write(json.dumps(asdict(s) | {"args": _jsonable(s.args)}) + "\n")
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
