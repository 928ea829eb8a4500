"""The run's plots: reward, KL/D3 and a stacked timing bar per step (PNG, no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TIMING_PARTS = (("timing/gen_s", "generation"), ("timing/env_s", "env/tool/reward"),
                ("timing/learner_s", "learner"), ("timing/sync_s", "weight sync"),
                ("timing/learner_wait_s", "learner waiting"))


def write_plots(recs: list[dict[str, Any]], out: Path) -> list[Path]:
    """Write reward.png, is.png and timing.png under `out`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    steps = [r["step"] for r in recs]
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4))
    for key in ("reward/mean", "reward/pass_rate"):
        ax.plot(steps, [r.get(key, float("nan")) for r in recs], label=key)
    ax.set_xlabel("step")
    ax.legend()
    ax.set_title("reward")
    paths.append(_save(fig, out / "reward.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    for key in ("is/d3", "is/d3_mismatch", "is/d3_lag", "kl/rollout_learner"):
        # symlog: exact zeros (aligned mismatch) stay visible; the linear band ends below
        # any mismatch float32 logprobs can show, so a tiny one is not drawn as 0
        ax.plot(steps, [r.get(key, float("nan")) for r in recs], label=key)
    ax.set_yscale("symlog", linthresh=1e-16)
    ax.set_xlabel("step")
    ax.legend()
    mismatch = [r["is/d3_mismatch"] for r in recs if "is/d3_mismatch" in r]
    said = ("" if not mismatch else "; is/d3_mismatch exactly 0 at every step" if not any(mismatch)
            else f"; is/d3_mismatch max {max(mismatch):.3g}")
    ax.set_title(f"rollout vs learner: D3 and KL{said}")
    paths.append(_save(fig, out / "is.png"))

    paths.append(timing_plot(recs, out / "timing.png"))
    return paths


def timing_plot(recs: list[dict[str, Any]], path: Path) -> Path:
    """A stacked bar per step of where the seconds went (actor-seconds, so parts can sum
    above the step's wall time when rollout and learner overlap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in recs]
    fig, ax = plt.subplots(figsize=(max(6, len(steps) * 0.25), 4))
    bottom = [0.0] * len(recs)
    for key, label in TIMING_PARTS:
        vals = [r.get(key, 0.0) for r in recs]
        ax.bar(steps, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.plot(steps, [r.get("timing/step_s", 0.0) for r in recs], "k.-", label="step wall")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7)
    ax.set_title("time per step")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
