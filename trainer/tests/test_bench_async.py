"""`parity bench async`: every (lag, track_mismatch) pair is run with its overrides, and
each row carries updates/hour against the sync run with the same track_mismatch, held-out
success and per-actor utilisation from the run's exclusive states."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_profile_states import _run_with_states

from parity.trainer import bench
from parity.trainer.config import TrainConfig


def test_bench_runs_every_lag_with_and_without_the_split(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, int, bool, int]] = []

    def fake_training(cfg: TrainConfig, run_dir: Path) -> dict[str, Any]:
        seen.append((cfg.train.mode, cfg.max_lag, cfg.train.track_mismatch, cfg.train.steps))
        _run_with_states(run_dir)
        speed = (1 + cfg.max_lag) * (1.0 if cfg.train.track_mismatch else 2.0)
        return {"steps": 2, "updates_per_hour": 100.0 * speed,
                "heldout_success_before": 0.25, "heldout_success_after": 0.5}

    monkeypatch.setattr(bench, "run_training", fake_training)
    res = bench.bench_async(None, 3, tmp_path, [])
    assert seen == [(mode, lag, track, 3) for mode, lag in
                    (("sync", 0), ("async", 2), ("async", 8), ("async", 64))
                    for track in (True, False)]
    rows = {r["name"]: r for r in res["runs"]}
    assert list(rows) == ["sync", "sync-nosplit", "async-lag2", "async-lag2-nosplit",
                          "async-lag8", "async-lag8-nosplit", "async-lag64",
                          "async-lag64-nosplit"]
    assert rows["async-lag8"]["speedup_vs_sync"] == pytest.approx(9.0)
    assert rows["async-lag8-nosplit"]["speedup_vs_sync"] == pytest.approx(9.0)  # vs its sync
    assert rows["sync-nosplit"]["updates_per_hour"] == pytest.approx(200.0)
    assert rows["async-lag64"]["heldout_success_after"] == 0.5
    assert rows["sync"]["utilisation"] == pytest.approx({"learner": 0.25, "rollout-0": 0.5})
    assert sum(rows["sync"]["states"]["rollout-0"].values()) == pytest.approx(1.0)


def test_bench_refuses_a_used_directory(tmp_path: Path) -> None:
    # a used run directory would be continued and its old steps mixed into the figures
    (tmp_path / "sync").mkdir()
    with pytest.raises(FileExistsError, match=r"--out: .* is not empty; give a new directory"):
        bench.bench_async(None, 3, tmp_path, [])
    assert (tmp_path / "sync").is_dir()  # nothing removed
