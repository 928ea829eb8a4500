"""`parity profile RUN_DIR`: where a run's wall time went.

Reads metrics.jsonl and spans.jsonl. Per actor (the learner, each rollout worker) and per
step: the wall time split into exclusive states that add up to 100% (`state_seconds`).
Per turn and per episode: generation, env, sandbox and reward latency as distributions.
Apart from those, in their own table: actor-seconds per span category, summed over
concurrent episodes (so above the wall time), and the slowest turns.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from parity.core.timing import (
    BACKWARD,
    D3_SPLIT,
    DECODE,
    FORWARD,
    GENERATING,
    LEARNER_OTHER,
    OPTIMIZER,
    PREFILL,
    STATE_ORDER,
    Span,
    percentile,
    read_spans,
    state_seconds,
)
from parity.trainer.rundir import WALL_PARTS, read_metrics

# an actor's utilisation: the share of wall spent on its own job
BUSY = {FORWARD, BACKWARD, OPTIMIZER, D3_SPLIT, LEARNER_OTHER, PREFILL, DECODE, GENERATING}

# (level, what, span categories summed per turn or per episode); a turn's env is the env
# step after that model turn (the last turn's includes scoring: category "reward")
LATENCIES = (
    ("turn", "generation", ("gen",)),
    ("turn", "env", ("env", "reward")),
    ("turn", "sandbox", ("sandbox",)),
    ("episode", "generation", ("gen",)),
    ("episode", "env", ("env", "reward")),
    ("episode", "sandbox", ("sandbox",)),
    ("episode", "reward", ("reward",)),
    ("episode", "total", ("episode",)),
)
QUANTILES = (50, 90, 99)


def profile_run(run_dir: str | Path, n_slowest: int = 10) -> dict[str, Any]:
    """The report as plain data (what `--json` prints)."""
    root = Path(run_dir)
    recs = read_metrics(root)
    if not recs:
        raise FileNotFoundError(f"{root}: no metrics.jsonl records (is this a run directory?)")
    spans = read_spans(root / "spans.jsonl")
    wall = sum(r.get("timing/step_s", 0.0) for r in recs)
    steps = len(recs)
    states = {track: actor_states(by_step) for track, by_step in state_seconds(spans).items()}
    return {
        "run_dir": str(root),
        "steps": steps,
        "steps_s": wall,
        "run": _run_wall(root),
        "states": states,
        "utilisation": {track: sum(v for k, v in st["share"].items() if k in BUSY)
                        for track, st in states.items()},
        "latency": latencies(spans),
        "actor_seconds": actor_seconds(spans, wall, steps),
        "slowest_turns": slowest_turns(spans, n_slowest),
    }


def _run_wall(root: Path) -> dict[str, float] | None:
    """The whole run's wall and its parts (start-up, training steps, held-out evaluation)
    from summary.json; None while the run has not finished."""
    try:
        summary = json.loads((root / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    keys = ("wall_s", *WALL_PARTS)
    return {k: summary[k] for k in keys} if all(k in summary for k in keys) else None


def actor_states(by_step: dict[int, dict[str, float]]) -> dict[str, Any]:
    """One actor's states over the run: seconds, share of the wall, and per step."""
    total: dict[str, float] = defaultdict(float)
    for states in by_step.values():
        for state, sec in states.items():
            total[state] += sec
    wall = sum(total.values())
    order = sorted(total, key=_state_order)
    return {
        "wall_s": wall,
        "seconds": {k: total[k] for k in order},
        "share": {k: total[k] / wall if wall else 0.0 for k in order},
        "per_step": {step: dict(states) for step, states in sorted(by_step.items())},
    }


def _state_order(state: str) -> tuple[int, str]:
    return (STATE_ORDER.index(state) if state in STATE_ORDER else len(STATE_ORDER), state)


def latencies(spans: Iterable[Span]) -> list[dict[str, Any]]:
    """Per turn and per episode: n, mean, p50/p90/p99 and max seconds of each `LATENCIES`
    row that has spans."""
    spans = [s for s in spans if s.episode]
    rows = []
    for level, what, cats in LATENCIES:
        sums: dict[tuple[str, str, int], float] = defaultdict(float)
        for s in spans:
            if s.cat in cats and (level == "episode" or s.turn >= 0):
                sums[(s.track, s.episode, s.turn if level == "turn" else -1)] += s.dur
        if sums:
            vals = list(sums.values())
            rows.append({"level": level, "what": what, "n": len(vals),
                         "mean": sum(vals) / len(vals), "max": max(vals),
                         **{f"p{q}": percentile(vals, q) for q in QUANTILES}})
    return rows


def actor_seconds(spans: Iterable[Span], wall: float, steps: int) -> dict[str, dict[str, float]]:
    """Seconds per span category summed over actors and concurrent episodes: total, per
    step, and as a multiple of the run's wall time (above 1 where episodes overlap)."""
    per_cat: dict[str, float] = defaultdict(float)
    for s in spans:
        if s.cat not in ("episode", "state", "hold", "step"):  # parents, and the budget's own
            per_cat[s.cat] += s.dur
    return {cat: {"total_s": sec, "per_step_s": sec / steps, "x_wall": sec / wall if wall else 0.0}
            for cat, sec in sorted(per_cat.items(), key=lambda kv: -kv[1])}


def slowest_turns(spans: Iterable[Span], n: int) -> list[dict[str, Any]]:
    """The `n` turns (a generation plus the env step after it) with the most seconds."""
    turns: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in spans:
        if s.turn >= 0 and s.cat in ("gen", "env", "reward"):
            turns[(s.episode, s.turn)][s.cat] += s.dur
    slow = sorted(turns.items(), key=lambda kv: -sum(kv[1].values()))[:n]
    return [{"episode": ep, "turn": t, "total_s": sum(parts.values()), **dict(parts)}
            for (ep, t), parts in slow]


def wall_line(run: dict[str, float]) -> str:
    """'wall 184.0 s = start-up 20.1 + training steps 110.5 + held-out evaluation 53.4'."""
    return (f"wall {run['wall_s']:.1f} s = start-up {run['startup_s']:.1f} + training steps "
            f"{run['steps_s']:.1f} + held-out evaluation {run['heldout_s']:.1f}")


def render(report: dict[str, Any]) -> None:
    """Print the report as rich tables."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"[bold]{report['run_dir']}[/]: {report['steps']} steps, "
              f"{report['steps_s']:.1f} s of training steps (what the tables below cover)")
    if report["run"]:
        con.print(wall_line(report["run"]))
    if not report["states"]:
        con.print("no exclusive-state spans in spans.jsonl (a run from before they existed)")
    for track, st in report["states"].items():
        n = len(st["per_step"])
        t = Table(title=f"{track}: where the wall time went (exclusive states, "
                        f"{100 * report['utilisation'][track]:.1f}% busy)")
        for col in ("state", "s", "% of wall", "s / step"):
            t.add_column(col, justify="left" if col == "state" else "right")
        for state, sec in st["seconds"].items():
            t.add_row(state, f"{sec:.2f}", f"{100 * st['share'][state]:.1f}",
                      f"{sec / max(n, 1):.3f}")
        t.add_row("[bold]total[/]", f"{st['wall_s']:.2f}",
                  f"{100 * sum(st['share'].values()):.1f}", f"{st['wall_s'] / max(n, 1):.3f}")
        con.print(t)
    if report["latency"]:
        t = Table(title="latency distributions (seconds)")
        for col in ("per", "what", "n", "mean", "p50", "p90", "p99", "max"):
            t.add_column(col, justify="left" if col in ("per", "what") else "right")
        for row in report["latency"]:
            t.add_row(row["level"], row["what"], str(row["n"]),
                      *(f"{row[k]:.3f}" for k in ("mean", "p50", "p90", "p99", "max")))
        con.print(t)
    t = Table(title="actor-seconds (concurrent episodes): summed over actors and overlapping "
                    "episodes, so not a share of the wall")
    for col in ("category", "actor-s", "actor-s / step", "× wall"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for cat, row in report["actor_seconds"].items():
        t.add_row(cat, f"{row['total_s']:.2f}", f"{row['per_step_s']:.3f}",
                  f"{row['x_wall']:.2f}")
    con.print(t)
    if report["slowest_turns"]:
        t = Table(title="slowest turns")
        for col in ("episode", "turn", "total s", "gen s", "env s"):
            t.add_column(col)
        for row in report["slowest_turns"]:
            t.add_row(row["episode"], str(row["turn"]), f"{row['total_s']:.3f}",
                      f"{row.get('gen', 0.0):.3f}", f"{row.get('env', 0.0):.3f}")
        con.print(t)
