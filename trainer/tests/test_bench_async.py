"""`parity bench async`: every (lag, track_mismatch) pair is run with its overrides on every
seed, seeds in the outer loop; each run carries updates/hour against the sync run with the
same track_mismatch and seed, and each arm its updates/hour over all seeds and held-out
success paired with sync's on the same seeds. `run_training` is replaced by a stand-in that
writes a run's files: the bench's own bookkeeping is what is under test here (the real runs
are in tests/test_e2e_trainer.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_profile_states import _run_with_states
from typer.testing import CliRunner

from parity.trainer import bench
from parity.trainer.cli import app
from parity.trainer.config import TrainConfig


def _fake(seen: list[tuple[str, int, bool, int, int]]):
    def fake_training(cfg: TrainConfig, run_dir: Path) -> dict[str, Any]:
        seen.append((cfg.train.mode, cfg.max_lag, cfg.train.track_mismatch, cfg.train.steps,
                     cfg.train.seed))
        _run_with_states(run_dir)
        speed = (1 + cfg.max_lag) * (1.0 if cfg.train.track_mismatch else 2.0)
        seed = cfg.train.seed
        # seed 1 runs at half the speed; held-out: sync 0.5 + 0.1·seed, async 0.05 lower
        return {"steps": 2, "updates_per_hour": 100.0 * speed / (1 + seed),
                "heldout_success_before": 0.25,
                "heldout_success_after": 0.5 + 0.1 * seed - (0.05 if cfg.max_lag else 0.0)}
    return fake_training


def test_bench_runs_every_lag_with_and_without_the_split(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, int, bool, int, int]] = []
    monkeypatch.setattr(bench, "run_training", _fake(seen))
    res = bench.bench_async(None, 3, tmp_path, [])
    assert seen == [(mode, lag, track, 3, 0) for mode, lag in
                    (("sync", 0), ("async", 2), ("async", 8), ("async", 64))
                    for track in (True, False)]
    rows = {r["name"]: r for r in res["runs"]}
    assert list(rows) == ["sync", "sync-nosplit", "async-lag2", "async-lag2-nosplit",
                          "async-lag8", "async-lag8-nosplit", "async-lag64",
                          "async-lag64-nosplit"]
    assert [a["name"] for a in res["arms"]] == list(rows)
    assert rows["async-lag8"]["speedup_vs_sync"] == pytest.approx(9.0)
    assert rows["async-lag8-nosplit"]["speedup_vs_sync"] == pytest.approx(9.0)  # vs its sync
    assert rows["sync-nosplit"]["updates_per_hour"] == pytest.approx(200.0)
    assert rows["async-lag64"]["heldout_success_after"] == 0.45
    assert rows["sync"]["utilisation"] == pytest.approx({"learner": 0.25, "rollout-0": 0.5})
    assert sum(rows["sync"]["states"]["rollout-0"].values()) == pytest.approx(1.0)
    assert rows["async-lag2"]["run_dir"] == str(tmp_path / "async-lag2" / "seed0")
    lag2 = res["arms"][2]
    assert lag2["heldout_vs_sync"] == pytest.approx(-0.05)
    assert lag2["heldout_vs_sync_sem"] is None  # one seed has no standard error


def test_bench_over_seeds_pairs_each_arm_with_sync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, int, bool, int, int]] = []
    monkeypatch.setattr(bench, "run_training", _fake(seen))
    res = bench.bench_async(None, 2, tmp_path, ["train.seed=0"], seeds=2, lags=(4,),
                            track=(True,))
    # seeds outer: a machine that slows down part-way slows both arms alike
    assert [(s[1], s[4]) for s in seen] == [(0, 0), (4, 0), (0, 1), (4, 1)]
    assert res["seeds"] == [0, 1]
    sync, lag4 = res["arms"]
    assert lag4["name"] == "async-lag4" and lag4["seeds"] == [0, 1]
    # 2 updates at 500/h and 2 at 250/h: 4 updates in 0.024 h, not the mean of the rates
    assert lag4["updates_per_hour"] == pytest.approx(4 / (2 / 500 + 2 / 250))
    assert lag4["speedup_vs_sync"] == pytest.approx(5.0)
    assert lag4["heldout_success_after"] == pytest.approx(0.5)
    assert lag4["heldout_success_after_sem"] == pytest.approx(0.05)
    assert lag4["heldout_vs_sync"] == pytest.approx(-0.05)
    assert lag4["heldout_vs_sync_sem"] == pytest.approx(0.0)
    assert sync["heldout_vs_sync"] == pytest.approx(0.0)


def test_bench_cli_prints_paired_held_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "run_training", _fake([]))
    r = CliRunner().invoke(app, ["bench", "async", "--seeds", "2", "--lag", "4", "--split", "on",
                                 "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert "run 1/4: sync, seed 0" in r.output and "run 4/4: async-lag4, seed 1" in r.output
    assert "async-lag4:" in r.output and "(5.00x sync)" in r.output
    assert "held-out success 50.0% ± 5.0 (sync -5.0 ± 0.0)" in r.output
    bad = CliRunner().invoke(app, ["bench", "async", "--split", "sometimes"])
    assert bad.exit_code == 2
    assert "--split: 'sometimes' is not one of on, off, both" in bad.output


def test_bench_refuses_a_used_directory(tmp_path: Path) -> None:
    # a used run directory would be continued and its old steps mixed into the figures
    (tmp_path / "sync").mkdir()
    with pytest.raises(FileExistsError, match=r"--out: .* is not empty; give a new directory"):
        bench.bench_async(None, 3, tmp_path, [])
    assert (tmp_path / "sync").is_dir()  # nothing removed
