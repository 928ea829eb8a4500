"""The embedded default, shortened: real Ray, the shipped model, the real sandboxed Python
tool. The run directory, metrics, summary and checkpoint must be complete, and `--resume`
must continue the run with no lost or repeated update."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parity.core.trace import trace_nesting_errors

ROOT = Path(__file__).resolve().parents[1]
PARITY = str(Path(sys.executable).parent / "parity")
SHORT = ["--set", "train.steps=3", "--set", "train.checkpoint_every=3", "--set",
         "rollout.group_size=4", "--set", "rollout.groups_per_step=2",
         "--set", "eval.heldout_episodes=8"]


@pytest.mark.slow
def test_default_run_is_complete_and_resumable(tmp_path):
    run = tmp_path / "run"
    r = subprocess.run([PARITY, "train", "--out", str(run), *SHORT], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "held-out success" in r.stdout
    for name in ("config.toml", "metrics.jsonl", "summary.json", "trace.json", "spans.jsonl",
                 "plots/reward.png", "plots/timing.png", "checkpoints/latest"):
        assert (run / name).exists(), name
    assert list((run / "tb").iterdir()), "no TensorBoard events"
    assert trace_nesting_errors(json.loads((run / "trace.json").read_text())) == []
    summary = json.loads((run / "summary.json").read_text())
    for key in ("heldout_success_before", "heldout_success_after", "is/d3_mismatch_max",
                "wall_s", "updates"):
        assert key in summary, key
    assert summary["updates"] == 3
    assert summary["is/d3_mismatch_max"] == 0.0
    assert 0.0 <= summary["heldout_success_before"] <= 1.0
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in recs] == [0, 1, 2]
    for key in ("reward/mean", "is/d3", "is/d3_mismatch", "is/d3_lag", "is/ess_frac",
                "kl/rollout_learner", "lag/max", "grad/norm", "lr", "timing/step_s",
                "timing/gen_s", "timing/env_s", "timing/learner_s", "timing/sync_s",
                "timing/learner_wait_s", "timing/rollout_idle_frac", "throughput/tokens_per_s"):
        assert all(key in rec for rec in recs), key
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    assert (ckpt / "model" / "config.json").is_file()
    assert any((ckpt / "model").glob("*.safetensors"))

    r = subprocess.run([PARITY, "train", "--resume", str(run), "--set", "train.steps=5"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in recs] == [0, 1, 2, 3, 4]
    assert json.loads((run / "summary.json").read_text())["heldout_success_before"] == \
        summary["heldout_success_before"]
    assert trace_nesting_errors(json.loads((run / "trace.json").read_text())) == []
