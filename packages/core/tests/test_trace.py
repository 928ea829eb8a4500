"""The Chrome/Perfetto trace shows whole: on every row, complete events nest like a call stack,
and every row is named. Perfetto mis-stacks or drops events that partly overlap on a row."""

from __future__ import annotations

import itertools
import json
import zlib
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from parity.core.timing import (
    CATEGORIES,
    STATE_ORDER,
    Span,
)
from parity.core.trace import chrome_trace, trace_nesting_errors

T = 1733456789.123456  # a time.time() reading: about 0.24 µs between floats


def _complete(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def _thread_names(trace: dict[str, Any]) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def test_adjacent_states_touch_not_overlap() -> None:
    # rounded apart, 0.2500001 s is 250000.1 µs, but the next state starts at the float sum,
    # T + 0.2500001, which is T + 0.25 (the 0.1 µs is below the clock's resolution)
    a = Span("optimizer", "state", "learner", T, 0.2500001)
    b = Span("forward", "state", "learner", a.end, 0.5)
    trace = chrome_trace([a, b])
    xa, xb = sorted(_complete(trace), key=lambda e: e["ts"])
    assert (xa["ts"], xa["dur"], xb["ts"], xb["dur"]) == (0, 250_000, 250_000, 500_000)
    assert xa["tid"] == xb["tid"] == 0
    assert trace_nesting_errors(trace) == []


def test_episode_covers_a_child_read_before_its_start() -> None:
    spans = [
        Span("env step", "env", "rollout-0", T, 0.0021, episode="g0-0", turn=-1),
        Span("episode g0-0", "episode", "rollout-0", T + 0.001, 1.0, episode="g0-0"),
        Span("generate", "gen", "rollout-0", T + 0.0021, 0.9, episode="g0-0", turn=0),
        Span("env + reward", "reward", "rollout-0", T + 0.9021, 0.1, episode="g0-0", turn=0),
    ]
    trace = chrome_trace(spans)
    xs = {e["name"]: e for e in _complete(trace)}
    assert len({e["tid"] for e in xs.values()}) == 1
    # widened to its children: from the env step's start to the reward's end (1.0021 s)
    assert (xs["episode g0-0"]["ts"], xs["episode g0-0"]["dur"]) == (0, 1_002_100)
    assert (xs["env step"]["ts"], xs["env step"]["dur"]) == (0, 2100)
    assert (xs["generate"]["ts"], xs["generate"]["dur"]) == (2100, 900_000)
    assert trace_nesting_errors(trace) == []


def test_episodes_whose_hashes_collide_get_their_own_rows() -> None:
    seen: dict[int, str] = {}
    for i in itertools.count():
        eid = f"g{i}-0"
        h = zlib.crc32(eid.encode()) % 10_000
        if h in seen:
            a, b = seen[h], eid
            break
        seen[h] = eid
    spans = [
        Span(f"episode {a}", "episode", "rollout-0", T, 1.0, episode=a),
        Span("generate", "gen", "rollout-0", T, 1.0, episode=a, turn=0),
        Span(f"episode {b}", "episode", "rollout-0", T + 0.5, 1.0, episode=b),
        Span("generate", "gen", "rollout-0", T + 0.5, 1.0, episode=b, turn=0),
        Span(f"episode {b}x", "episode", "rollout-0", T + 1.0, 1.0, episode=f"{b}x"),
    ]
    trace = chrome_trace(spans)
    tid = {e["name"]: e["tid"] for e in _complete(trace) if e["cat"] == "episode"}
    assert tid[f"episode {a}"] != tid[f"episode {b}"]
    assert tid[f"episode {b}x"] == tid[f"episode {a}"]  # a's slot is free again at its end
    names = _thread_names(trace)
    assert sorted(names[(1, t)] for t in set(tid.values())) == ["episode slot 1",
                                                                 "episode slot 2"]
    assert trace_nesting_errors(trace) == []


def test_overlapping_spans_of_one_kind_split_onto_rows() -> None:
    spans = [
        Span("idle", "state", "learner", T, 3.0),
        Span("fwd a", "learner_fwd", "learner", T, 1.0),
        Span("fwd b", "learner_fwd", "learner", T + 0.5, 1.0),
        Span("inner", "sync", "learner", T + 0.1, 0.2),
        Span("fwd c", "learner_fwd", "learner", T + 1.5, 1.0),
    ]
    trace = chrome_trace(spans)
    tid = {e["name"]: e["tid"] for e in _complete(trace)}
    assert tid == {"idle": 0, "fwd a": 1, "inner": 1, "fwd b": 2, "fwd c": 1}
    assert _thread_names(trace) == {(1, 0): "state (exclusive)", (1, 1): "spans",
                                    (1, 2): "spans 2"}
    sort = {e["tid"]: e["args"]["sort_index"] for e in trace["traceEvents"]
            if e["name"] == "thread_sort_index"}
    assert sort == {0: 0, 1: 1, 2: 2}
    assert trace_nesting_errors(trace) == []


def test_nesting_errors_name_the_overlap_and_the_unnamed_row() -> None:
    trace = {"traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "r"}},
        {"ph": "X", "name": "a", "pid": 1, "tid": 0, "ts": 0, "dur": 10},
        {"ph": "X", "name": "b", "pid": 1, "tid": 0, "ts": 10, "dur": 5},  # touches: fine
        {"ph": "X", "name": "c", "pid": 1, "tid": 0, "ts": 12, "dur": 3},  # nested: fine
        {"ph": "X", "name": "d", "pid": 1, "tid": 0, "ts": 14.9, "dur": 0.2},
        {"ph": "X", "name": "e", "pid": 1, "tid": 7, "ts": 0, "dur": 1},
    ]}
    errors = trace_nesting_errors(trace)
    assert len(errors) == 2
    assert "'d'" in errors[0] and "'c'" in errors[0]
    assert "tid 7" in errors[1] and "thread_name" in errors[1]


_TRACKS = ("driver", "learner", "rollout-0", "rollout-1")
_OTHER_CATS = tuple(c for c in CATEGORIES if c not in ("state", "episode"))
_CHILD_CATS = ("gen", "env", "reward", "sandbox")
_offsets = st.floats(0.0, 5.0, allow_nan=False)
_durs = st.floats(0.0, 2.0, allow_nan=False)
_episode_durs = st.floats(1e-3, 2.0)  # wide enough that no episode's hull is a point


@st.composite
def _spans(draw: st.DrawFn) -> list[Span]:
    """An actor's state spans tiling its time (as `StateClock` records them), episodes that
    overlap each other with children that may start before or end after them (or overlap
    each other), and other spans of any category overlapping anything."""
    spans: list[Span] = []
    for track in draw(st.lists(st.sampled_from(_TRACKS), min_size=1, max_size=3, unique=True)):
        now = T + draw(_offsets)
        for d in draw(st.lists(st.floats(1e-7, 0.5), max_size=12)):
            since, now = now, now + d
            spans.append(Span(draw(st.sampled_from(STATE_ORDER)), "state", track, since,
                              now - since))
        for k in range(draw(st.integers(0, 6))):
            eid = f"g{k}-{draw(st.integers(0, 3))}"
            start, dur = T + draw(_offsets), draw(_episode_durs)
            spans.append(Span(f"episode {eid}", "episode", track, start, dur, episode=eid))
            for turn in range(draw(st.integers(0, 4))):
                c0 = start + draw(st.floats(-1e-4, 1.0)) * dur
                spans.append(Span("child", draw(st.sampled_from(_CHILD_CATS)), track, c0,
                                  draw(st.floats(0.0, 1.0001)) * dur, episode=eid, turn=turn))
        for _ in range(draw(st.integers(0, 8))):
            spans.append(Span("other", draw(st.sampled_from(_OTHER_CATS)), track,
                              T + draw(_offsets), draw(_durs)))
    for i, s in enumerate(spans):
        s.args["i"] = i
    return spans


@settings(max_examples=300, deadline=None)
@given(_spans())
def test_any_spans_nest_on_named_rows(spans: list[Span]) -> None:
    trace = json.loads(json.dumps(chrome_trace(spans)))  # as Perfetto reads it
    assert trace_nesting_errors(trace) == []
    xs = _complete(trace)
    assert sorted(e["args"]["i"] for e in xs) == list(range(len(spans)))
    process = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
               if e["name"] == "process_name"}
    t0 = min(s.start for s in spans) if spans else 0.0
    for e in xs:
        s = spans[e["args"]["i"]]
        assert (e["name"], e["cat"], process[e["pid"]]) == (s.name, s.cat, s.track)
        if not s.episode:  # only an episode's events move (to nest within it)
            assert (e["ts"], e["ts"] + e["dur"]) == (round((s.start - t0) * 1e6),
                                                     round((s.end - t0) * 1e6))
    # episode slots: as few rows as the most episodes in flight at once on an actor
    slots = Counter(pid for (pid, _), name in _thread_names(trace).items()
                    if name.startswith("episode slot"))
    hulls: dict[tuple[int, str], list[int]] = {}
    for e in xs:
        if "episode" in e["args"]:
            h = hulls.setdefault((e["pid"], e["args"]["episode"]), [e["ts"], e["ts"] + e["dur"]])
            h[0], h[1] = min(h[0], e["ts"]), max(h[1], e["ts"] + e["dur"])
    for pid in process:
        ends = [(lo, 1) for (p, _), (lo, _) in hulls.items() if p == pid]
        ends += [(hi, -1) for (p, _), (_, hi) in hulls.items() if p == pid]
        depth = max(itertools.accumulate(d for _, d in sorted(ends)), default=0)
        assert slots[pid] == depth
