"""`parity bench async`: the same env, model, seed and number of updates trained sync,
async with max_lag 2 and async with max_lag 8, side by side in one process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parity.trainer.config import load_train_config
from parity.trainer.train import run_training

MODES = (("sync", ["train.mode=\"sync\""]),
         ("async-lag2", ["train.mode=\"async\"", "train.max_lag=2"]),
         ("async-lag8", ["train.mode=\"async\"", "train.max_lag=8"]))


def bench_async(config: Path, steps: int, out: Path, overrides: list[str]) -> dict[str, Any]:
    """Run the three modes; returns updates/hour (over the runs' step wall time), the
    ratio to sync, and the final reward (mean of the last quarter of steps)."""
    from parity.trainer.rundir import read_metrics

    runs = []
    for name, mode in MODES:
        cfg = load_train_config(config, [*overrides, *mode, f"train.steps={steps}",
                                         "output.progress=false", "output.tensorboard=false",
                                         "eval.heldout_episodes=0"])
        summary = run_training(cfg, out / name)
        recs = read_metrics(out / name)
        tail = recs[-max(1, len(recs) // 4):]
        runs.append({"name": name, "max_lag": cfg.max_lag, "steps": summary["steps"],
                     "wall_s": summary["wall_s"], "updates_per_hour": summary["updates_per_hour"],
                     "final_reward": sum(r["reward/mean"] for r in tail) / len(tail),
                     "run_dir": str(out / name)})
    base = runs[0]["updates_per_hour"]
    for r in runs:
        r["speedup_vs_sync"] = r["updates_per_hour"] / base if base else 0.0
    return {"config": str(config), "overrides": overrides, "steps": steps, "runs": runs}
