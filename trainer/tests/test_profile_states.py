"""Exclusive states (StateClock, state_seconds), latency percentiles and the profile's
tables, on constructed spans with exact expected values."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from parity.core import timing
from parity.core.timing import (
    DECODE,
    ENV_WAIT,
    FORWARD,
    HELD,
    IDLE,
    PREFILL,
    UNRECORDED,
    WAITING,
    Span,
    StateClock,
    Timeline,
    percentile,
    state_seconds,
)
from parity.trainer.cli import app
from parity.trainer.profile import latencies, profile_run
from parity.trainer.rundir import RunDir


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_state_clock_tiles_time_and_nests(monkeypatch: pytest.MonkeyPatch) -> None:
    t = FakeTime()
    monkeypatch.setattr(timing.time, "time", t)
    tl = Timeline("rollout-0")
    clock = StateClock(tl, IDLE)
    t.now = 101.0
    clock.enter(ENV_WAIT)
    t.now = 101.5
    with clock.during(DECODE):
        t.now = 102.0
    clock.enter(ENV_WAIT)  # the same state: no transition, no span
    t.now = 103.0
    clock.cut()
    t.now = 103.25
    clock.enter(IDLE)
    got = [(s.name, s.cat, s.start, s.dur) for s in tl.drain()]
    assert got == [(IDLE, "state", 100.0, 1.0), (ENV_WAIT, "state", 101.0, 0.5),
                   (DECODE, "state", 101.5, 0.5), (ENV_WAIT, "state", 102.0, 1.0),
                   (ENV_WAIT, "state", 103.0, 0.25)]
    hold = StateClock(Timeline("rollout-0"), None, cat="hold")  # None: nothing recorded
    t.now = 104.0
    hold.enter(HELD)
    t.now = 105.0
    hold.enter(None)
    t.now = 106.0
    hold.cut()
    assert [(s.name, s.cat, s.start, s.dur) for s in hold.timeline.drain()] == [
        (HELD, "hold", 104.0, 1.0)]


def test_state_seconds_clips_to_windows_holds_and_unrecorded() -> None:
    spans = [
        Span("step 0", "step", "driver", 0.0, 4.0, step=0),
        Span("step 1", "step", "driver", 4.0, 4.0, step=1),
        # a worker: prefill across the step boundary, then idle with a hold inside it
        Span(PREFILL, "state", "rollout-0", 0.0, 5.0),
        Span(IDLE, "state", "rollout-0", 5.0, 3.0),
        Span(HELD, "hold", "rollout-0", 6.0, 1.0),
        Span(HELD, "hold", "rollout-0", 2.0, 1.0),  # during prefill: not a hold of the idle
        # the learner's states start late and end early: the rest is unrecorded
        Span(WAITING, "state", "learner", 1.0, 2.0),
        Span(FORWARD, "state", "learner", 3.0, 4.5),
        Span("generate", "gen", "rollout-0", 0.0, 5.0, episode="g0-0", turn=0),
    ]
    got = state_seconds(spans)
    assert got["rollout-0"] == {0: {PREFILL: 4.0}, 1: {PREFILL: 1.0, IDLE: 2.0, HELD: 1.0}}
    assert got["learner"] == {0: {WAITING: 2.0, FORWARD: 1.0, UNRECORDED: 1.0},
                              1: {FORWARD: 3.5, UNRECORDED: 0.5}}
    for by_step in got.values():
        for step, states in by_step.items():
            assert sum(states.values()) == pytest.approx(4.0), (step, states)


def test_percentile_is_linear_between_ranks() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 90) == pytest.approx(3.7)
    assert percentile(xs, 99) == pytest.approx(3.97)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_latencies_per_turn_and_episode() -> None:
    spans = []
    for e in range(5):  # episode e: two turns of generation e+1 and 2(e+1) s
        ep = f"g0-{e}"
        spans += [Span("generate", "gen", "rollout-0", 0.0, e + 1.0, episode=ep, turn=0),
                  Span("env step", "env", "rollout-0", 0.0, 0.5, episode=ep, turn=0),
                  Span("sandbox", "sandbox", "rollout-0", 0.0, 0.25, episode=ep, turn=0),
                  Span("generate", "gen", "rollout-0", 0.0, 2 * (e + 1.0), episode=ep, turn=1),
                  Span("env + reward", "reward", "rollout-0", 0.0, 0.1 * e, episode=ep, turn=1),
                  Span("reset", "env", "rollout-0", 0.0, 1.0, episode=ep, turn=-1),
                  Span(f"episode {ep}", "episode", "rollout-0", 0.0, 10.0, episode=ep)]
    rows = {(r["level"], r["what"]): r for r in latencies(spans)}
    gen_turn = rows[("turn", "generation")]  # 1..5 and 2..10: ten turns
    assert gen_turn["n"] == 10 and gen_turn["max"] == 10.0
    assert gen_turn["p50"] == pytest.approx(percentile([1, 2, 3, 4, 5, 2, 4, 6, 8, 10], 50))
    assert gen_turn["p50"] == pytest.approx(4.0)
    assert gen_turn["p90"] == pytest.approx(8.2)
    gen_ep = rows[("episode", "generation")]  # 3(e+1): 3, 6, 9, 12, 15
    assert gen_ep["n"] == 5 and gen_ep["p50"] == 9.0 and gen_ep["p99"] == pytest.approx(14.88)
    assert rows[("turn", "env")]["n"] == 10  # the reset (turn -1) is not a turn
    assert rows[("episode", "env")]["p50"] == pytest.approx(1.0 + 0.5 + 0.2)
    assert rows[("turn", "sandbox")]["n"] == 5 and rows[("turn", "sandbox")]["p99"] == 0.25
    assert rows[("episode", "reward")]["mean"] == pytest.approx(0.2)
    assert rows[("episode", "total")]["p90"] == 10.0


def _run_with_states(root: Path) -> None:
    run = RunDir(root)
    for k in range(2):
        t0 = 10.0 * k
        run.log({"step": k, "reward/mean": 0.0, "timing/step_s": 4.0})
        run.log_spans([
            Span(f"step {k}", "step", "driver", t0, 4.0, step=k),
            Span(WAITING, "state", "learner", t0, 3.0, step=k),
            Span(FORWARD, "state", "learner", t0 + 3.0, 1.0, step=k),
            Span(DECODE, "state", "rollout-0", t0, 2.0, step=k),
            Span(ENV_WAIT, "state", "rollout-0", t0 + 2.0, 1.0, step=k),
            Span(IDLE, "state", "rollout-0", t0 + 3.0, 1.0, step=k),
            Span(HELD, "hold", "rollout-0", t0 + 3.5, 0.5, step=k),
            # eight concurrent episodes: 16 actor-seconds of generation in a 4 s step
            *(Span("generate", "gen", "rollout-0", t0, 2.0, step=k, episode=f"g{k}-{m}",
                   turn=0) for m in range(8)),
        ])


def test_profile_report_and_cli_tables(tmp_path: Path) -> None:
    _run_with_states(tmp_path / "run")
    rep = profile_run(tmp_path / "run")
    w = rep["states"]["rollout-0"]
    assert w["wall_s"] == pytest.approx(8.0)
    assert w["share"] == pytest.approx({DECODE: 0.5, ENV_WAIT: 0.25, HELD: 0.125, IDLE: 0.125})
    assert list(w["share"]) == [DECODE, ENV_WAIT, HELD, IDLE]  # the documented order
    assert rep["states"]["learner"]["per_step"][1] == pytest.approx({WAITING: 3.0, FORWARD: 1.0})
    assert rep["actor_seconds"]["gen"]["x_wall"] == pytest.approx(4.0)
    r = CliRunner().invoke(app, ["profile", str(tmp_path / "run")], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    out = r.output
    assert "learner: where the wall time went" in out and "rollout-0: where the wall" in out
    assert out.count("100.0") >= 2  # each actor's table totals 100% of the wall
    assert "latency distributions" in out and "actor-seconds (concurrent episodes)" in out
    assert (tmp_path / "run" / "plots" / "timing.png").stat().st_size > 0
