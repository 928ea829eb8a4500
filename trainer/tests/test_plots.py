"""What the run's plots show, checked on the figures (no image comparison)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from parity.trainer import plots


def _recs(n: int, **series: list[float]) -> list[dict[str, Any]]:
    return [{"step": s} | {k: v[s] for k, v in series.items()} for s in range(n)]


def _ax(fig: Figure) -> Axes:
    return fig.axes[0]


def _drawn(ax: Axes) -> list[str]:
    """Labels of the lines that hold data (not legend proxies or markers without a label)."""
    return [ln.get_label() for ln in ax.lines if not ln.get_label().startswith("_")]


def _legend_texts(ax: Axes) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


def _integer_ticks(ax: Axes) -> bool:
    return all(float(t).is_integer() for t in ax.get_xticks())


def test_reward_one_line_when_pass_rate_is_the_mean() -> None:
    mean = [0.25, 0.5, 0.75]  # 0/1 rewards: the pass rate is the mean
    ax = _ax(plots.reward_figure(_recs(3, **{"reward/mean": mean, "reward/pass_rate": mean})))
    assert len(_drawn(ax)) == 1
    assert list(ax.lines[0].get_ydata()) == mean
    assert "reward/pass_rate" in _drawn(ax)[0]  # the line says it is both


def test_reward_two_lines_when_pass_rate_differs() -> None:
    recs = _recs(3, **{"reward/mean": [0.2, 0.4, 0.6], "reward/pass_rate": [0.2, 0.3, 0.6]})
    assert _drawn(_ax(plots.reward_figure(recs))) == ["reward/mean", "reward/pass_rate"]


def test_heldout_markers_at_their_steps() -> None:
    recs = _recs(4, **{"reward/mean": [0.1, 0.2, 0.3, 0.4]})
    ax = _ax(plots.reward_figure(recs, heldout={4: 0.625, 0: 0.25}))
    (line,) = [ln for ln in ax.lines if ln.get_label() == "held-out success"]
    assert list(line.get_xdata()) == [0, 4]
    assert list(line.get_ydata()) == [0.25, 0.625]
    assert line.get_marker() not in ("None", "", None)


def test_reward_axes_labelled_and_zero_to_one() -> None:
    recs = _recs(3, **{"reward/mean": [0.0, 0.5, 1.0]})
    ax = _ax(plots.reward_figure(recs, heldout={0: 0.0, 3: 1.0}))
    assert ax.get_xlabel() == "step"
    assert ax.get_ylabel() == "reward / success"
    lo, hi = ax.get_ylim()
    assert -0.05 <= lo <= 0.0 and 1.0 <= hi <= 1.05
    # rewards outside [0, 1] (a scored env) are not cut off at 1
    assert _ax(plots.reward_figure(_recs(2, **{"reward/mean": [0.5, 3.0]}))).get_ylim()[1] > 3


@pytest.mark.parametrize("n", [1, 3])
def test_step_axes_have_integer_ticks(n: int) -> None:
    vals = [0.5, 1e-3, 2e-3][:n]
    recs = _recs(n, **{"reward/mean": vals, "is/d3": vals})
    states = {"learner": {s: {"forward": 1.0, "waiting for data": 0.5} for s in range(n)}}
    for fig in (plots.reward_figure(recs), plots.is_figure(recs), plots.timing_figure(states)):
        fig.canvas.draw()
        assert all(_integer_ticks(ax) for ax in fig.axes)


def test_is_log_axis_bounded_by_the_data() -> None:
    d3 = [0.0, 2e-3, 4e-4, 5e-3]  # step 0 is on-policy: exactly 0
    kl = [0.0, 1.5e-5, 3e-5, 2e-5]
    ax = _ax(plots.is_figure(_recs(4, **{"is/d3": d3, "kl/update_sampled": kl})))
    assert ax.get_yscale() == "log"
    lo, hi = ax.get_ylim()
    assert 1.5e-5 / 100 <= lo <= 1.5e-5 and 5e-3 <= hi <= 5e-3 * 100
    # the zero is not a gap: named in the label and marked on the floor
    assert "is/d3 (0 at step 0)" in _drawn(ax)
    assert any(list(ln.get_xdata()) == [0] and list(ln.get_ydata()) == [lo]
               for ln in ax.lines)


def test_all_zero_mismatch_named_not_drawn() -> None:
    recs = _recs(3, **{"is/d3": [1e-3, 2e-3, 3e-3], "is/d3_mismatch": [0.0, 0.0, 0.0],
                       "is/d3_lag": [1e-3, 2e-3, 3e-3]})
    ax = _ax(plots.is_figure(recs))
    assert not any("is/d3_mismatch" in label for label in _drawn(ax))
    assert "is/d3_mismatch exactly 0 at every step" in ax.get_title()
    assert any(t.startswith("is/d3_mismatch") for t in _legend_texts(ax))


def test_is_all_zero_says_so() -> None:
    zero = [0.0, 0.0]
    ax = _ax(plots.is_figure(_recs(2, **{"is/d3": zero, "is/d3_mismatch": zero})))
    assert _drawn(ax) == []
    assert any("is/d3: exactly 0 at every step" in t.get_text() for t in ax.texts)
    assert list(ax.get_yticks()) == []


def test_is_negative_value_drawn_as_magnitude() -> None:
    ax = _ax(plots.is_figure(_recs(2, **{"is/d3": [-3e-9, 1e-3]})))
    assert list(ax.lines[0].get_ydata()) == [3e-9, 1e-3]
    assert any("negative" in t for t in _legend_texts(ax))


def test_legends_outside_the_axes() -> None:
    recs = _recs(3, **{"reward/mean": [0.2, 0.4, 0.6], "reward/pass_rate": [0.1, 0.4, 0.6],
                       "is/d3": [1e-3, 2e-3, 3e-3], "is/d3_mismatch": [0.0, 0.0, 0.0],
                       "kl/rollout_learner": [1e-4, 2e-3, 1e-3]})
    for fig in (plots.reward_figure(recs, heldout={0: 0.1, 3: 0.7}), plots.is_figure(recs)):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legend, ax = _ax(fig).get_legend(), _ax(fig)
        box = legend.get_window_extent(renderer)
        assert not box.overlaps(ax.get_window_extent(renderer))
        assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1)


def test_write_plots_writes_the_three_pngs(tmp_path: Path) -> None:
    recs = _recs(2, **{"reward/mean": [0.0, 1.0], "is/d3": [0.0, 1e-3]})
    paths = plots.write_plots(recs, [], tmp_path / "plots", heldout={0: 0.0, 2: 0.5})
    assert [p.name for p in paths] == ["reward.png", "is.png", "timing.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
