"""The fused attention kernel: one row's bits whatever the path, the batch, the threads or the
cache's layout; close to exact attention; a batch-dependent variant refused by the start-up
proof; and the GEMM-tile path where no compiler exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from parity.model import fused
from parity.model.layout import SeqLayout

pytestmark = pytest.mark.skipif(not fused.available(), reason=fused.describe())

HQ, HKV, D, T = 4, 2, 64, 150


@pytest.fixture(scope="module")
def qkv():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(T, HQ, D, generator=g), torch.randn(T, HKV, D, generator=g),
            torch.randn(T, HKV, D, generator=g))


def _dense(x: torch.Tensor, length: int) -> torch.Tensor:
    """Keys of one sequence [n, Hkv, D] as [1, Hkv, length, D], zeros past them."""
    out = x.new_zeros(length, *x.shape[1:])
    out[: x.shape[0]] = x
    return out.transpose(0, 1).unsqueeze(0).contiguous()


def _attend(q, k, v, first: int, n: int) -> torch.Tensor:
    """Rows first..first+n-1 of the sequence, its keys cached up to them."""
    length = -(-(first + n) // 64) * 64
    out, _ = fused.attention(q[first:first + n], _dense(k[: first + n], length),
                             _dense(v[: first + n], length),
                             SeqLayout.from_lengths([n], [first]), q.shape[-1]**-0.5)
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("d", [16, 64, 80])  # the head dim in 16-lane chunks: 1, 4, 4 + 1
def test_decode_prefill_and_chunks_give_the_same_bits(threads, d):
    g = torch.Generator().manual_seed(d)
    q, k, v = (torch.randn(T, h, d, generator=g) for h in (HQ, HKV, HKV))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = _attend(q, k, v, 0, T)
        for i in range(T):
            assert torch.equal(_attend(q, k, v, i, 1)[0], whole[i])
        for chunk in (1, 7, 64, 65):
            parts = [_attend(q, k, v, a, min(chunk, T - a)) for a in range(0, T, chunk)]
            assert torch.equal(torch.cat(parts), whole)
    finally:
        torch.set_num_threads(before)


def test_a_paged_pool_read_in_place_gives_the_dense_bits(qkv):
    """The same keys in 16-slot blocks scattered over a pool, bf16 or fp32, beside others."""
    q, k, v = qkv
    g = torch.Generator().manual_seed(1)
    blocks = torch.randperm(40, generator=g)[:10].to(torch.int32)  # 160 slots for 150 keys
    for dtype in (torch.float32, torch.bfloat16):
        kd, vd = k.to(dtype), v.to(dtype)
        pool_k = torch.randn(40, HKV, 16, D, generator=g).to(dtype)
        pool_v = torch.randn(40, HKV, 16, D, generator=g).to(dtype)
        for b in range(10):
            n = min(16, T - 16 * b)
            pool_k[blocks[b], :, :n] = kd[16 * b: 16 * b + n].transpose(0, 1)
            pool_v[blocks[b], :, :n] = vd[16 * b: 16 * b + n].transpose(0, 1)
        # the sequence's last 5 rows decoded as one call, beside a sequence of random blocks
        other = torch.randperm(40, generator=g)[:4].to(torch.int32)
        table = torch.stack([torch.cat([other, other[:1].repeat(6)]), blocks])
        layout = SeqLayout.from_lengths([3, 5], [40, T - 5])
        qs = torch.cat([torch.randn(3, HQ, D, generator=g), q[T - 5:]])
        paged, _ = fused.attention(qs, pool_k, pool_v, layout, D**-0.5, table)
        dense = _attend(q, kd.float(), vd.float(), T - 5, 5)
        assert torch.equal(paged[3:], dense)


def test_close_to_exact_attention(qkv):
    q, k, v = qkv
    out = _attend(q, k, v, 0, T).double()
    kk = k.double().repeat_interleave(HQ // HKV, 1).transpose(0, 1)
    vv = v.double().repeat_interleave(HQ // HKV, 1).transpose(0, 1)
    scores = q.double().transpose(0, 1) @ kk.transpose(1, 2) * D**-0.5
    scores.masked_fill_(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    exact = (scores.softmax(-1) @ vv).transpose(0, 1)
    assert (out - exact).abs().max().item() < 2e-6


_BATCH_DEPENDENT = """
import json, sys
from pathlib import Path
from parity.model import AlignmentError, Decoder, ModelConfig, fused
source = fused.SOURCE.read_text()
exact = "for (int i = 0; i < NV; i++) s[q][i] += qd * kd[i];"
assert exact in source
# a variant whose scores depend on how many query vectors share a pass: decode (a row's 2
# heads) rounds differently from prefill (4 vectors a pass)
variant = Path(sys.argv[1]) / "attention.c"
variant.write_text(source.replace(exact, exact.replace("kd[i];", "kd[i] * (nq == 4 ? 1.0000001f : 1.0f);")))
fused.SOURCE = variant
cfg = ModelConfig(model_type="qwen2", vocab_size=97, hidden_size=64, intermediate_size=896,
                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
try:
    Decoder(cfg, "aligned")
    print(json.dumps({"serves": fused.describe(), "refused": ""}))
except AlignmentError as e:
    print(json.dumps({"serves": fused.describe(), "refused": str(e)}))
"""


def test_the_proof_refuses_a_batch_dependent_kernel(tmp_path):
    env = {**os.environ, "PARITY_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _BATCH_DEPENDENT, str(tmp_path)], env=env,
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["serves"].startswith("fused: attention-")
    refused = result["refused"]
    assert refused.startswith("aligned kernels are not bit-identical across batch shapes")
    assert "attention 4/2 heads x 16: position 1 decoded alone" in refused, refused


_NO_COMPILER = """
import json
from parity.model import Decoder, ModelConfig, fused, rowwise
cfg = ModelConfig(model_type="qwen2", vocab_size=97, hidden_size=64, intermediate_size=896,
                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
model = Decoder(cfg, "aligned")  # the proof passes on the GEMM-tile path and torch's norm
print(json.dumps({"serves": fused.describe(), "reads_paged": model.reads_paged,
                  "rowwise": rowwise.describe()}))
"""


def test_without_a_compiler_attention_runs_on_gemm_tiles_and_norms_on_torch(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "PARITY_CACHE_DIR": str(tmp_path)}
    env.pop("CC", None)
    out = subprocess.run([sys.executable, "-c", _NO_COMPILER], env=env, capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout) == {
        "serves": "GEMM tiles (no C compiler (set CC, or install gcc))", "reads_paged": False,
        "rowwise": "torch ops (no C compiler (set CC, or install gcc))"}
