"""The Chrome/Perfetto timeline of a run's spans (`parity.core.timing`): one process per
actor, its exclusive states, the driver's holds, its other spans and its episodes on rows
where they nest like a call stack; and the check that a trace does nest so."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from parity.core.timing import Span, jsonable


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
            "dur": e.end - e.ts, "args": jsonable(args)}


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
