"""`model.dtype = "bfloat16"` end to end: real Ray, the shipped model, the sandboxed Python
tool. Aligned bf16 keeps the mismatch at exactly 0, checkpoints keep the fp32 masters (a
resume continues), standard bf16 shows its mismatch, and a checkpoint bf16 would round is
refused before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARITY = str(Path(sys.executable).parent / "parity")
SHORT = ["--set", "train.steps=3", "--set", "train.checkpoint_every=3", "--set",
         "rollout.group_size=4", "--set", "rollout.groups_per_step=2",
         "--set", "eval.heldout_episodes=0", "--set", "output.progress=false",
         "--set", "model.dtype=\"bfloat16\""]


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PARITY, "train", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_aligned_bf16_run_has_zero_mismatch_and_resumes_from_fp32_masters(tmp_path):
    from safetensors import safe_open

    run = tmp_path / "run"
    r = _train("--out", str(run), *SHORT)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] == 3
    assert summary["is/d3_mismatch_max"] == 0.0
    assert summary["is/d3_lag/max"] > 0  # the split measured something: lag, not mismatch
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip() / "model"
    assert json.loads((ckpt / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(str(next(ckpt.glob("*.safetensors"))), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}  # noqa: SIM118

    r = _train("--resume", str(run), "--set", "train.steps=4")
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in recs] == [0, 1, 2, 3]
    assert all(rec["is/d3_mismatch"] == 0.0 for rec in recs)


@pytest.mark.slow
def test_standard_bf16_run_measures_its_mismatch(tmp_path):
    run = tmp_path / "run"
    r = _train("--out", str(run), *SHORT, "--set", "model.kernels=\"standard\"",
               "--set", "train.steps=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["is/d3_mismatch_max"] > 0


def test_bf16_of_a_float32_checkpoint_stops_in_preflight(tmp_path):
    import torch

    from parity.model import load_model, save_model
    from parity.trainer.embedded import EMBEDDED_DIR

    model_dir = tmp_path / "fp32"
    save_model(load_model(EMBEDDED_DIR, kernels="standard", dtype=torch.float32), model_dir)
    for f in EMBEDDED_DIR.iterdir():  # its tokenizer
        if f.name.startswith("tokenizer"):
            (model_dir / f.name).write_bytes(f.read_bytes())
    t0 = time.time()
    r = _train("--out", str(tmp_path / "run"), "--set", f"model.path=\"{model_dir}\"",
               "--set", "model.dtype=\"bfloat16\"")
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "model.dtype = 'bfloat16'" in lines[0] and "stored as F32" in lines[0]
    assert time.time() - t0 < 60
