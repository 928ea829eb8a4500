"""The run's plots: reward with held-out success, KL/D3 and, per actor, a bar per step of
its wall time stacked by exclusive state (PNG, no display).

Each `*_figure` returns a laid-out Figure drawn without pyplot (no global state to close,
no display backend), so tests can check what a plot shows without comparing images."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.core.timing import STATE_ORDER, Span, state_seconds

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# kl/update and kl/update_sampled/bounded are opt-in (train.track_update_kl, optim.max_update_kl);
# the D3 split needs train.track_mismatch: a key no record has is left out
IS_KEYS = ("is/d3", "is/d3_mismatch", "is/d3_lag", "kl/rollout_learner", "kl/update",
           "kl/update_sampled", "kl/update_bounded")


def write_plots(recs: list[dict[str, Any]], spans: list[Span], out: Path, *,
                heldout: dict[int, float] | None = None) -> list[Path]:
    """Write reward.png, is.png and timing.png under `out`; returns their paths.

    `heldout`: step → held-out pass rate in [0, 1] where it was measured (before training
    at step 0 and after the last step)."""
    out.mkdir(parents=True, exist_ok=True)
    return [_save(reward_figure(recs, heldout), out / "reward.png"),
            _save(is_figure(recs), out / "is.png"),
            timing_plot(state_seconds(spans), out / "timing.png")]


def reward_figure(recs: list[dict[str, Any]], heldout: dict[int, float] | None = None
                  ) -> Figure:
    """reward/mean per step, reward/pass_rate where it differs from it, held-out success
    as markers at the steps it was measured."""
    fig = _figure((8, 4))
    ax = fig.subplots()
    steps = [r["step"] for r in recs]
    mean = _series(recs, "reward/mean")
    rate = _series(recs, "reward/pass_rate")
    has_rate = any("reward/pass_rate" in r for r in recs)
    # with 0/1 rewards the pass rate is the mean: a second line would hide the first
    same = all(_same(m, p) for m, p in zip(mean, rate, strict=True))
    ax.plot(steps, mean, marker=".",
            label="reward/mean (= reward/pass_rate)" if has_rate and same else "reward/mean")
    if has_rate and not same:
        ax.plot(steps, rate, marker=".", label="reward/pass_rate")
    values = mean + (rate if has_rate else [])
    if heldout:
        at = sorted(heldout)
        ax.plot(at, [heldout[s] for s in at], marker="o", markersize=7, linestyle="--",
                label="held-out success")
        values += list(heldout.values())
    finite = [v for v in values if math.isfinite(v)]
    if finite and all(0.0 <= v <= 1.0 for v in finite):
        ax.set_ylim(-0.03, 1.03)  # a margin: points at 0 or 1 are not cut by the frame
    ax.set_ylabel("reward / success")
    ax.set_title("reward" + (" and held-out success" if heldout else ""))
    _step_axis(ax)
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def is_figure(recs: list[dict[str, Any]]) -> Figure:
    """D3 (total, mismatch, lag) and the KL estimates per step on a log axis bounded by the
    drawn values' nonzero magnitudes; a series that is 0 at every step is named, not drawn.

    All these keys are ≥ 0 by construction (D3 is the mean of w − 1 − log w, the KLs the
    mean of ½(log w)²), so a negative value is a bug: it is drawn as |value| with a hollow
    marker rather than folded away."""
    from matplotlib.lines import Line2D

    fig = _figure((9, 4))
    ax = fig.subplots()
    steps = [r["step"] for r in recs]
    series = {k: _series(recs, k) for k in IS_KEYS if any(k in r for r in recs)}
    drawn = {k: v for k, v in series.items() if any(math.isfinite(x) and x for x in v)}
    notes = [f"{k}: exactly 0 at every step" if any(math.isfinite(x) for x in v)
             else f"{k}: no finite value" for k, v in series.items() if k not in drawn]
    mismatch = [x for x in series.get("is/d3_mismatch", []) if math.isfinite(x)]
    said = ("" if not mismatch else "; is/d3_mismatch exactly 0 at every step"
            if not any(mismatch) else f"; is/d3_mismatch max {max(mismatch):.3g}")
    ax.set_title(f"rollout vs learner: D3 and KL{said}")
    _step_axis(ax)
    if not drawn:  # a frame with no data would read as missing data; say what the values are
        ax.text(0.5, 0.5, "\n".join(notes) or "no D3/KL recorded", transform=ax.transAxes,
                ha="center", va="center")
        ax.set_yticks([])
        if steps:
            ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
        fig.tight_layout()
        return fig

    mags = [abs(x) for v in drawn.values() for x in v if math.isfinite(x) and x]
    # a decade of margin, on decades: the tick labels bound the data
    floor = 10.0 ** (math.floor(math.log10(min(mags))) - 1)
    ax.set_yscale("log")
    ax.set_ylim(floor, 10.0 ** (math.ceil(math.log10(max(mags))) + 1))
    for key, v in drawn.items():
        zero = [s for s, x in zip(steps, v, strict=True) if x == 0]
        # named in the label too: the series' carets can sit on one another (step 0)
        said = (f" (0 at step {zero[0]})" if len(zero) == 1
                else f" (0 at {len(zero)} steps)" if zero else "")
        (line,) = ax.plot(steps, [abs(x) if x else math.nan for x in v], marker=".",
                          label=key + said)
        if zero:  # log has no 0: a caret on the floor, so a 0 is not read as a gap
            ax.plot(zero, [floor] * len(zero), linestyle="none", marker=10, markersize=9,
                    color=line.get_color(), clip_on=False)
        neg = [(s, -x) for s, x in zip(steps, v, strict=True) if x < 0]
        if neg:
            ax.plot(*zip(*neg, strict=True), linestyle="none", marker="o", markersize=8,
                    markerfacecolor="none", color=line.get_color())
    extra: list[Artist] = []
    if any(x == 0 for v in drawn.values() for x in v):
        extra.append(Line2D([], [], color="gray", marker=10, markersize=9, linestyle="none",
                            label="on the floor: exactly 0 at that step"))
    if any(x < 0 for v in drawn.values() for x in v):
        extra.append(Line2D([], [], color="gray", marker="o", markerfacecolor="none",
                            linestyle="none", label="negative: |value| drawn"))
    extra += [Line2D([], [], linestyle="none", label=f"{n} (not drawn)") for n in notes]
    ax.set_ylabel("per token (nats)")
    _legend_outside(ax, ax.get_legend_handles_labels()[0] + extra)
    fig.tight_layout()
    return fig


def timing_plot(states: dict[str, dict[int, dict[str, float]]], path: Path) -> Path:
    """Save `timing_figure(states)` to `path`; returns it."""
    return _save(timing_figure(states), path)


def timing_figure(states: dict[str, dict[int, dict[str, float]]]) -> Figure:
    """One panel per actor: a bar per step of its wall time stacked by exclusive state
    (`parity.core.timing.state_seconds`), so each bar is that step's wall."""
    import matplotlib

    tracks = list(states) or ["(no state spans)"]
    n_steps = max((len(v) for v in states.values()), default=1)
    fig = _figure((max(6, n_steps * 0.25), 2.6 * len(tracks) + 0.8))
    axes = fig.subplots(len(tracks), 1, squeeze=False, sharex=True)
    colors = matplotlib.colormaps["tab20"].colors
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
        _step_axis(ax, label=ax is axes[-1, 0])  # shared x: one label, at the bottom
        if present:
            ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def _figure(figsize: tuple[float, float]) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)  # renders (layout, savefig) without pyplot or a display
    return fig


def _series(recs: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r.get(key, math.nan)) for r in recs]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _step_axis(ax: Axes, label: bool = True) -> None:
    from matplotlib.ticker import MaxNLocator

    if label:
        ax.set_xlabel("step")
    # steps are integers; min_n_ticks=1: over a range under ~1 step (a one-step run)
    # integer=True alone still picks fractional ticks
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _legend_outside(ax: Axes, handles: list[Artist] | None = None) -> None:
    """The legend right of the axes, where it cannot cover the data."""
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=80)
    return path
