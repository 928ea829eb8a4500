"""`parity profile RUN_DIR`: where a run's wall time went.

Reads metrics.jsonl and spans.jsonl; reports actor-seconds per category (total, share of
the run's wall time, mean per step), idle fractions of the learner and the rollout
workers, and the slowest turns (a turn = one generation plus the env step after it).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from parity.core.timing import read_spans
from parity.trainer.rundir import read_metrics


def profile_run(run_dir: str | Path, n_slowest: int = 10) -> dict[str, Any]:
    """The breakdown as plain data (what `--json` prints)."""
    root = Path(run_dir)
    recs = read_metrics(root)
    if not recs:
        raise FileNotFoundError(f"{root}: no metrics.jsonl records (is this a run directory?)")
    spans = read_spans(root / "spans.jsonl")
    wall = sum(r.get("timing/step_s", 0.0) for r in recs)
    steps = len(recs)
    per_cat: dict[str, float] = defaultdict(float)
    for s in spans:
        if s.cat != "episode":
            per_cat[s.cat] += s.dur
    workers = sorted({s.track for s in spans if s.track.startswith("rollout")})
    breakdown = {
        cat: {"total_s": sec, "share_of_wall": sec / wall if wall else 0.0,
              "per_step_s": sec / steps}
        for cat, sec in sorted(per_cat.items(), key=lambda kv: -kv[1])
    }
    learner_busy = sum(per_cat.get(c, 0.0) for c in ("learner_fwd", "learner_bwd", "optim"))
    turns: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in spans:
        if s.turn >= 0 and s.cat in ("gen", "env", "reward"):
            turns[(s.episode, s.turn)][s.cat] += s.dur
    slow = sorted(turns.items(), key=lambda kv: -sum(kv[1].values()))[:n_slowest]
    return {
        "run_dir": str(root),
        "steps": steps,
        "wall_s": wall,
        "breakdown": breakdown,
        "idle": {
            "learner_wait_frac": per_cat.get("learner_wait", 0.0) / wall if wall else 0.0,
            "learner_busy_frac": learner_busy / wall if wall else 0.0,
            "rollout_idle_frac": (per_cat.get("rollout_idle", 0.0) / (wall * len(workers))
                                  if wall and workers else 0.0),
            "rollout_workers": len(workers),
        },
        "slowest_turns": [
            {"episode": ep, "turn": t, "total_s": sum(parts.values()), **dict(parts)}
            for (ep, t), parts in slow
        ],
    }


def render(report: dict[str, Any]) -> None:
    """Print the report as rich tables."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"[bold]{report['run_dir']}[/]: {report['steps']} steps, "
              f"{report['wall_s']:.1f} s wall")
    t = Table(title="actor-seconds by category")
    for col in ("category", "total s", "% of wall", "s / step"):
        t.add_column(col, justify="right" if col != "category" else "left")
    for cat, row in report["breakdown"].items():
        t.add_row(cat, f"{row['total_s']:.2f}", f"{100 * row['share_of_wall']:.1f}",
                  f"{row['per_step_s']:.3f}")
    con.print(t)
    idle = report["idle"]
    con.print(f"learner waiting {100 * idle['learner_wait_frac']:.1f}% · learner busy "
              f"{100 * idle['learner_busy_frac']:.1f}% · rollout idle "
              f"{100 * idle['rollout_idle_frac']:.1f}% ({idle['rollout_workers']} workers)")
    if report["slowest_turns"]:
        t = Table(title="slowest turns")
        for col in ("episode", "turn", "total s", "gen s", "env s"):
            t.add_column(col)
        for row in report["slowest_turns"]:
            t.add_row(row["episode"], str(row["turn"]), f"{row['total_s']:.3f}",
                      f"{row.get('gen', 0.0):.3f}", f"{row.get('env', 0.0):.3f}")
        con.print(t)
