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
    "gen", "env", "reward", "learner_fwd", "learner_bwd", "optim", "sync",
    "learner_wait", "episode", "sandbox", "state", "hold", "step",
)

# The exclusive states (span names of category "state"). Learner:
FORWARD, BACKWARD, OPTIMIZER, D3_SPLIT = "forward", "backward", "optimizer", "D3 split"
LEARNER_OTHER = "other (collate, IS stats, version history)"
WAITING, PUBLISHING, CHECKPOINTING = "waiting for data", "publishing weights", "checkpointing"
# rollout worker (PREFILL: an engine step computing any row of more than one token):
PREFILL, DECODE = "engine: prefill", "engine: decode"
# a vLLM worker sees only its requests, not the engine's steps: requests in flight
GENERATING = "engine: requests in flight (vLLM)"
ENV_WAIT = "waiting on envs"  # episodes in flight, the engine not stepping
HELD, LOADING, IDLE = "held by admission control", "loading weights", "idle"
UNRECORDED = "unrecorded"  # a step window's time no state span of the actor covers
STATE_ORDER = (FORWARD, BACKWARD, OPTIMIZER, D3_SPLIT, LEARNER_OTHER, PUBLISHING, CHECKPOINTING,
               WAITING, PREFILL, DECODE, GENERATING, ENV_WAIT, LOADING, HELD, IDLE, UNRECORDED)


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


def chrome_trace(spans: Iterable[Span]) -> dict[str, Any]:
    """A Chrome/Perfetto trace (JSON object format): one process per track, complete ("X")
    events in whole microseconds since the earliest span, on named rows where they nest like
    a call stack (Perfetto mis-stacks or drops events that partly overlap on one row)."""
    spans = list(spans)
    t0 = min((s.start for s in spans), default=0.0)
    tracks = sorted({s.track for s in spans}, key=_track_order)
    events: list[dict[str, Any]] = []
    complete: list[dict[str, Any]] = []
    for pid, track in enumerate(tracks, 1):
        events += [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": track}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
             "args": {"sort_index": pid}},
        ]
        for tid, (row_name, row) in enumerate(_rows([s for s in spans if s.track == track], t0)):
            events += [
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                 "args": {"name": row_name}},
                {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                 "args": {"sort_index": tid}},
            ]
            complete += [_complete(e, pid, tid) for e in sorted(row, key=_stack_order)]
    return {"traceEvents": events + complete, "displayTimeUnit": "ms"}


@dataclass(slots=True)
class _Event:
    """A span placed on the trace's integer microsecond clock: ts and end are each rounded
    from the span's own times, so spans that touch (or nest) as floats still do."""

    ts: int
    end: int
    span: Span


def _stack_order(e: _Event) -> tuple[int, int, bool]:
    """Start order, the longer (enclosing) event first; an episode before an equal child."""
    return (e.ts, e.ts - e.end, e.span.cat != "episode")


def _complete(e: _Event, pid: int, tid: int) -> dict[str, Any]:
    s = e.span
    args = {"step": s.step, **({"episode": s.episode} if s.episode else {}),
            **({"turn": s.turn} if s.turn >= 0 else {}), **s.args}
    return {"ph": "X", "name": s.name, "cat": s.cat, "pid": pid, "tid": tid, "ts": e.ts,
            "dur": e.end - e.ts, "args": _jsonable(args)}


def _rows(spans: list[Span], t0: float) -> list[tuple[str, list[_Event]]]:
    """One actor's rows, top to bottom: its exclusive state, the driver's holds on it, its
    other spans, then its episodes packed onto "episode slot" rows (episodes overlap on a
    worker: continuous batching). A row is added only where spans would otherwise partly
    overlap, so each row nests properly."""
    lanes: dict[str, list[_Event]] = {"state (exclusive)": [], "admission": [], "spans": []}
    episodes: dict[str, list[_Event]] = defaultdict(list)
    for s in spans:
        e = _Event(round((s.start - t0) * 1e6), round((s.end - t0) * 1e6), s)
        if s.episode:
            episodes[s.episode].append(e)
        else:
            lanes[{"state": "state (exclusive)", "hold": "admission"}.get(s.cat, "spans")].append(e)
    out: list[tuple[str, list[_Event]]] = []
    for name, lane in lanes.items():
        out += [(name if i == 0 else f"{name} {i + 1}", row) for i, row in enumerate(_pack(lane))]
    slots = _slots([_nest(episodes[k]) for k in sorted(episodes)])
    return out + [(f"episode slot {i + 1}", row) for i, row in enumerate(slots)]


def _pack(events: list[_Event]) -> list[list[_Event]]:
    """Events onto rows, each on the lowest row where it nests in the open events (or where
    none is open): spans of one kind can still overlap on an actor (concurrent calls)."""
    rows: list[list[_Event]] = []
    stacks: list[list[_Event]] = []  # per row, its open events, innermost last
    for e in sorted(events, key=_stack_order):
        for stack in stacks:
            while stack and stack[-1].end <= e.ts:
                stack.pop()
        i = next((i for i, st in enumerate(stacks) if not st or e.end <= st[-1].end), len(rows))
        if i == len(rows):
            rows.append([])
            stacks.append([])
        rows[i].append(e)
        stacks[i].append(e)
    return rows


def _nest(events: list[_Event]) -> list[_Event]:
    """One episode's events made to nest on one row: its episode span widened to cover its
    children (they read the clock apart from it, some just before its start or after its
    end), then a child that outlasts the one it starts in cut to that one's end."""
    lo, hi = min(e.ts for e in events), max(e.end for e in events)
    for e in events:
        if e.span.cat == "episode":
            e.ts, e.end = lo, hi
    stack: list[_Event] = []
    for e in sorted(events, key=_stack_order):
        while stack and stack[-1].end <= e.ts:
            stack.pop()
        if stack:
            e.end = min(e.end, stack[-1].end)
        stack.append(e)
    return events


def _slots(episodes: list[list[_Event]]) -> list[list[_Event]]:
    """Episodes onto the fewest rows, each on the lowest-numbered slot free at its start, so
    overlapping episodes never share a row and rows get reused."""
    rows: list[list[_Event]] = []
    free_at: list[int] = []
    for events in sorted(episodes, key=lambda es: min(e.ts for e in es)):
        lo, hi = min(e.ts for e in events), max(e.end for e in events)
        i = next((i for i, t in enumerate(free_at) if t <= lo), len(rows))
        if i == len(rows):
            rows.append([])
            free_at.append(hi)
        rows[i] += events
        free_at[i] = hi
    return rows


def trace_nesting_errors(trace: dict[str, Any]) -> list[str]:
    """Why Perfetto would not show `trace` whole (empty: it would): on each (pid, tid) row,
    complete events sorted by (ts, -dur) must nest like a call stack (each starts at or after
    the end of the open one or ends at or before it; exact compares), and each row with
    complete events needs a thread_name."""
    rows: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    named: set[tuple[int, int]] = set()
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            rows[(e["pid"], e["tid"])].append(e)
        elif e["ph"] == "M" and e["name"] == "thread_name":
            named.add((e["pid"], e["tid"]))
    errors: list[str] = []
    for (pid, tid), row in sorted(rows.items()):
        if (pid, tid) not in named:
            errors.append(f"pid {pid} tid {tid}: {len(row)} events on a row with no thread_name")
        stack: list[dict[str, Any]] = []
        for e in sorted(row, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"]:
                top = stack[-1]
                errors.append(
                    f"pid {pid} tid {tid}: {e['name']!r} [{e['ts']}, {e['ts'] + e['dur']}] "
                    f"outlasts {top['name']!r} [{top['ts']}, {top['ts'] + top['dur']}] it starts in")
            stack.append(e)
    return errors


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
