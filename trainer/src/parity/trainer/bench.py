"""`parity bench async`: the same job (env, model, seed, number of updates) trained sync and
async with max_lag 2, 8 and 64, each with and without `train.track_mismatch` (the D3
split's extra forwards), one run after another in one process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parity.trainer.config import load_train_config
from parity.trainer.profile import profile_run
from parity.trainer.train import run_training

LAGS = (("sync", 0), ("async-lag2", 2), ("async-lag8", 8), ("async-lag64", 64))
TRACK_MISMATCH = (True, False)


def _overrides(lag: int, track: bool) -> list[str]:
    mode = ["train.mode=\"sync\""] if lag == 0 else ["train.mode=\"async\"",
                                                      f"train.max_lag={lag}"]
    return [*mode, f"train.track_mismatch={str(track).lower()}"]


def bench_async(config: Path | None, steps: int, out: Path, overrides: list[str]
                ) -> dict[str, Any]:
    """Run every (lag, track_mismatch) pair of `config` (None: the embedded default job).
    Per run: updates/hour over the step wall time (Ray and actor start-up and held-out
    evaluation excluded) and its ratio to sync with the same track_mismatch, held-out
    success before and after (`eval.heldout_episodes`), the reward of the last quarter of
    steps, and per actor its utilisation and exclusive-state shares (`parity profile`)."""
    from parity.trainer.rundir import read_metrics

    if out.exists() and any(out.iterdir()):
        # a run directory that holds a run would be continued, mixing its steps into these
        raise FileExistsError(f"--out: {out} is not empty; give a new directory")
    runs = []
    for name, lag in LAGS:
        for track in TRACK_MISMATCH:
            label = f"{name}{'' if track else '-nosplit'}"
            cfg = load_train_config(config, [*overrides, *_overrides(lag, track),
                                             f"train.steps={steps}", "output.progress=false",
                                             "output.tensorboard=false"])
            summary = run_training(cfg, out / label)
            recs = read_metrics(out / label)
            tail = recs[-max(1, len(recs) // 4):]
            prof = profile_run(out / label)
            runs.append({
                "name": label, "max_lag": cfg.max_lag, "track_mismatch": track,
                "steps": summary["steps"], "step_wall_s": prof["wall_s"],
                "updates_per_hour": summary["updates_per_hour"],
                "heldout_success_before": summary.get("heldout_success_before"),
                "heldout_success_after": summary.get("heldout_success_after"),
                "final_reward": sum(r["reward/mean"] for r in tail) / len(tail),
                "lag_max": max(r.get("lag/max", 0.0) for r in recs),
                "utilisation": prof["utilisation"],
                "states": {actor: st["share"] for actor, st in prof["states"].items()},
                "run_dir": str(out / label),
            })
    for r in runs:
        base = next(b for b in runs if b["max_lag"] == 0
                    and b["track_mismatch"] == r["track_mismatch"])["updates_per_hour"]
        r["speedup_vs_sync"] = r["updates_per_hour"] / base if base else 0.0
    return {"config": str(config) if config else "(embedded default)",
            "overrides": overrides, "steps": steps, "runs": runs}
