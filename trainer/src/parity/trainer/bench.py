"""`parity bench async`: the same job (env, model, number of updates) trained sync and async
with max_lag 2, 8 and 64 (or the lags asked for), each with and without
`train.track_mismatch` (the D3 split's extra forwards), over one or more seeds, one run after
another in one process.

Seeds run in the outer loop, so that a machine that slows down part-way slows every arm
alike. Held-out success differs from seed to seed by more than the ±3 points async is judged
by, so each arm is compared with sync on the same seeds: the mean of the paired differences
and its standard error."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parity.trainer.config import load_train_config
from parity.trainer.profile import profile_run
from parity.trainer.train import run_training

LAGS = (0, 2, 8, 64)
TRACK_MISMATCH = (True, False)


def arm_name(lag: int, track: bool) -> str:
    return f"{'sync' if lag == 0 else f'async-lag{lag}'}{'' if track else '-nosplit'}"


def _overrides(lag: int, track: bool, seed: int) -> list[str]:
    mode = ["train.mode=\"sync\""] if lag == 0 else ["train.mode=\"async\"",
                                                      f"train.max_lag={lag}"]
    return [*mode, f"train.track_mismatch={str(track).lower()}", f"train.seed={seed}"]


def _one_run(config: Path | None, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    from parity.trainer.rundir import read_metrics

    cfg = load_train_config(config, [*overrides, "output.progress=false",
                                     "output.tensorboard=false"])
    summary = run_training(cfg, run_dir)
    recs = read_metrics(run_dir)
    tail = recs[-max(1, len(recs) // 4):]
    prof = profile_run(run_dir)
    return {
        "max_lag": cfg.max_lag, "track_mismatch": cfg.train.track_mismatch,
        "seed": cfg.train.seed, "steps": summary["steps"], "step_wall_s": prof["steps_s"],
        "updates_per_hour": summary["updates_per_hour"],
        "heldout_success_before": summary.get("heldout_success_before"),
        "heldout_success_after": summary.get("heldout_success_after"),
        "final_reward": sum(r["reward/mean"] for r in tail) / len(tail),
        "lag_max": max(r.get("lag/max", 0.0) for r in recs),
        "utilisation": prof["utilisation"],
        "states": {actor: st["share"] for actor, st in prof["states"].items()},
        "run_dir": str(run_dir),
    }


def _mean_sem(xs: list[float]) -> tuple[float, float | None]:
    """The mean and its standard error (None from one value)."""
    sem = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None
    return statistics.fmean(xs), sem


def _arm(name: str, runs: list[dict[str, Any]], sync: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm over its seeds, against sync's runs with the same track_mismatch and seeds.
    Updates/hour is the arm's updates over its summed step wall time, so a slow seed counts
    by its time, not as one ratio among equals."""
    def rate(rs: list[dict[str, Any]]) -> float:
        return sum(r["steps"] for r in rs) / sum(r["steps"] / r["updates_per_hour"] for r in rs)

    arm: dict[str, Any] = {"name": name, "max_lag": runs[0]["max_lag"],
                           "track_mismatch": runs[0]["track_mismatch"],
                           "seeds": [r["seed"] for r in runs], "updates_per_hour": rate(runs)}
    arm["speedup_vs_sync"] = arm["updates_per_hour"] / rate(sync)
    after = [r["heldout_success_after"] for r in runs]
    if None not in after:
        arm["heldout_success_after"], arm["heldout_success_after_sem"] = _mean_sem(after)
        diffs = [a - s["heldout_success_after"] for a, s in zip(after, sync, strict=True)]
        arm["heldout_vs_sync"], arm["heldout_vs_sync_sem"] = _mean_sem(diffs)
    arm["final_reward"] = statistics.fmean(r["final_reward"] for r in runs)
    arm["utilisation"] = {a: statistics.fmean(r["utilisation"][a] for r in runs)
                          for a in runs[0]["utilisation"]}
    return arm


def bench_async(config: Path | None, steps: int, out: Path, overrides: list[str],
                seeds: int = 1, lags: tuple[int, ...] = LAGS,
                track: tuple[bool, ...] = TRACK_MISMATCH,
                log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run every (lag, track_mismatch) pair of `config` (None: the embedded default job) on
    `seeds` seeds from the config's `train.seed` on; sync (lag 0) always runs, as the baseline.
    Per run (`runs`): updates/hour over the step wall time (Ray and actor start-up and
    held-out evaluation excluded), held-out success before and after
    (`eval.heldout_episodes`), the reward of the last quarter of steps, and per actor its
    utilisation and exclusive-state shares (`parity profile`). Per arm (`arms`): updates/hour
    over all its seeds and the ratio to sync's, held-out success's mean and its difference
    from sync on the same seeds, each with its standard error, and mean utilisation."""
    if out.exists() and any(out.iterdir()):
        # a run directory that holds a run would be continued, mixing its steps into these
        raise FileExistsError(f"--out: {out} is not empty; give a new directory")
    first = load_train_config(config, overrides).train.seed
    seed_list = list(range(first, first + seeds))
    lags = (0, *sorted(set(lags) - {0}))
    runs: list[dict[str, Any]] = []
    total = seeds * len(lags) * len(track)
    for seed in seed_list:
        for lag in lags:
            for t in track:
                name = arm_name(lag, t)
                log(f"run {len(runs) + 1}/{total}: {name}, seed {seed}")
                row = _one_run(config, [*overrides, *_overrides(lag, t, seed),
                                        f"train.steps={steps}"],
                               out / name / f"seed{seed}")
                runs.append({"name": name, **row})
                log(f"  {row['updates_per_hour']:.0f} updates/h, held-out success "
                    f"{row['heldout_success_after']}")
    arms = []
    for lag in lags:
        for t in track:
            name = arm_name(lag, t)
            mine = [r for r in runs if r["name"] == name]
            sync = [r for r in runs if r["name"] == arm_name(0, t)]  # same seeds, same order
            for r, s in zip(mine, sync, strict=True):
                r["speedup_vs_sync"] = r["updates_per_hour"] / s["updates_per_hour"]
            arms.append(_arm(name, mine, sync))
    return {"config": str(config) if config else "(embedded default)", "overrides": overrides,
            "steps": steps, "seeds": seed_list, "arms": arms, "runs": runs}
