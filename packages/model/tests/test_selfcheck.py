"""The start-up proof: it passes for aligned kernels on every family's shapes, it fails where
rows really differ (standard kernels, a GEMM without the row tile), its refusal names the
shape and the fix, and its verdict is cached per machine and shape set."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from parity.model import ModelConfig
from parity.model.kernels import STANDARD
from parity.model.selfcheck import Shapes, cache_dir, fingerprint, refusal, verify

QWEN2 = ModelConfig(model_type="qwen2", vocab_size=97, hidden_size=64, intermediate_size=896,
                    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
QWEN3 = ModelConfig(model_type="qwen3", vocab_size=130, hidden_size=96, intermediate_size=256,
                    num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2, head_dim=32)
LLAMA = ModelConfig(model_type="llama", vocab_size=300, hidden_size=112, intermediate_size=1100,
                    num_hidden_layers=1, num_attention_heads=7, num_key_value_heads=1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh verdict cache: on disk under tmp_path, nothing remembered in memory."""
    from parity.model import selfcheck

    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(selfcheck, "_VERDICTS", {})
    return tmp_path


@pytest.mark.parametrize("cfg", [QWEN2, QWEN3, LLAMA], ids=["qwen2", "qwen3", "llama-g7"])
def test_aligned_kernels_pass_the_proof(cfg):
    v = verify(cfg, cache=False)
    assert v.ok, v.failure
    assert v.checks > 500
    assert v.threads == sorted({1, 2, torch.get_num_threads()})


def test_shapes_cover_every_gemm_and_the_qk_norm():
    s = Shapes.of(QWEN3)  # q/k/v stacked 96->(8+2+2)*32, gate/up 96->2*256, o and down 256->96
    assert s.linears == ((96, 130, False), (96, 384, False), (96, 512, False), (256, 96, False))
    assert s.attention == (8, 2, 32)
    assert s.norms == (96, 32)
    assert (64, 128, True) in Shapes.of(QWEN2).linears  # qwen2's stacked q/k/v, with its biases


def test_the_proof_finds_that_standard_kernels_differ():
    v = verify(QWEN2, kernels=STANDARD, cache=False)
    assert not v.ok
    assert "differ" in v.failure and "thread" in v.failure


_UNTILED = """
import json
from parity.model import AlignmentError, Decoder, ModelConfig, gemm
gemm.ROW_TILE = 1  # the GEMMs' row class taken away: calls of any row count reach the BLAS
cfg = ModelConfig(model_type="qwen2", vocab_size=97, hidden_size=64, intermediate_size=896,
                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
try:
    Decoder(cfg, "aligned")
    print(json.dumps({"refused": ""}))
except AlignmentError as e:
    print(json.dumps({"refused": str(e)}))
"""


def test_the_proof_refuses_a_gemm_without_the_row_tile(tmp_path):
    """Without the tile and without MKL's strict CNR, a row's bits depend on the row count on
    Intel and AMD alike; the proof must see it and aligned mode must be refused."""
    env = {**os.environ, "MKL_CBWR": "AUTO", "PARITY_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _UNTILED], env=env, capture_output=True,
                         text=True, check=True)
    refused = json.loads(out.stdout)["refused"]
    assert refused.startswith("aligned kernels are not bit-identical across batch shapes")
    assert "linear 64->" in refused or "linear 896->" in refused
    assert "Aligned mode is refused" in refused and "kernels='standard'" in refused
    assert "MKL_CBWR=AUTO,STRICT" in refused  # MKL was not in strict mode: say so


def test_refusal_names_the_machine_the_shape_and_the_fix():
    v = verify(QWEN2, kernels=STANDARD, cache=False)
    msg = refusal(v)
    assert v.failure in msg
    assert v.machine["cpu"] in msg and v.machine["torch"] in msg
    assert "is/d3_mismatch" in msg and "parity audit --json" in msg


def test_verdicts_are_cached_on_disk_per_shape_set(cache):
    from parity.model import selfcheck

    first = verify(QWEN2)
    files = list(cache_dir().glob("*.json"))
    assert first.ok and not first.cached and len(files) == 1
    assert json.loads(files[0].read_text())["ok"] is True
    selfcheck._VERDICTS.clear()
    again = verify(QWEN2)
    assert again.cached and again.ok and again.checks == first.checks
    verify(LLAMA)
    assert len(list(cache_dir().glob("*.json"))) == 2  # another shape set, another verdict
    files[0].write_text("{not json")
    selfcheck._VERDICTS.clear()
    redone = verify(QWEN2)
    assert redone.ok and not redone.cached  # a corrupt cache entry is proved again


def test_fingerprint_is_fixed_and_sees_the_arithmetic():
    a = fingerprint(QWEN2)
    torch.set_num_threads(1)
    try:
        assert fingerprint(QWEN2) == a  # aligned kernels: the thread count changes nothing
    finally:
        torch.set_num_threads(2)
    assert fingerprint(QWEN2, kernels=STANDARD) != a
    assert fingerprint(LLAMA) != a


def other_capability() -> str | None:
    """A torch dispatch level this CPU can run other than its own (another ISA's kernels)."""
    return {"AVX512": "avx2", "AVX2": "default"}.get(torch.backends.cpu.get_cpu_capability())


@pytest.mark.skipif(other_capability() is None, reason="no other torch dispatch level here")
def test_fingerprint_differs_on_another_dispatch_level(tmp_path):
    code = ("from parity.model import ModelConfig; from parity.model.selfcheck import fingerprint; "
            f"print(fingerprint(ModelConfig(**{QWEN2.model_dump(exclude_none=True)!r})))")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": other_capability(), "PARITY_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() != fingerprint(QWEN2)
