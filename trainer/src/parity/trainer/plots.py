"""The run's plots: reward, KL/D3 and, per actor, a bar per step of its wall time stacked
by exclusive state (PNG, no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parity.core.timing import STATE_ORDER, Span, state_seconds


def write_plots(recs: list[dict[str, Any]], spans: list[Span], out: Path) -> list[Path]:
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
    update_kl = tuple(k for k in ("kl/update", "kl/update_sampled")  # opt-in
                      if any(k in r for r in recs))
    for key in ("is/d3", "is/d3_mismatch", "is/d3_lag", "kl/rollout_learner", *update_kl):
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

    paths.append(timing_plot(state_seconds(spans), out / "timing.png"))
    return paths


def timing_plot(states: dict[str, dict[int, dict[str, float]]], path: Path) -> Path:
    """One panel per actor: a bar per step of its wall time stacked by exclusive state
    (`parity.core.timing.state_seconds`), so each bar is that step's wall."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tracks = list(states) or ["(no state spans)"]
    n_steps = max((len(v) for v in states.values()), default=1)
    fig, axes = plt.subplots(len(tracks), 1, squeeze=False, sharex=True,
                             figsize=(max(6, n_steps * 0.25), 2.6 * len(tracks) + 0.8))
    colors = plt.get_cmap("tab20").colors
    for ax, track in zip(axes[:, 0], tracks, strict=True):
        by_step = states.get(track, {})
        steps = sorted(by_step)
        present = {k for v in by_step.values() for k in v}
        bottom = [0.0] * len(steps)
        for i, state in enumerate(STATE_ORDER):
            if state in present:
                vals = [by_step[k].get(state, 0.0) for k in steps]
                ax.bar(steps, vals, bottom=bottom, label=state, color=colors[i % len(colors)])
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_ylabel("seconds")
        ax.set_title(f"{track}: step wall time by exclusive state", fontsize=9)
        if present:
            ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[-1, 0].set_xlabel("step")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
