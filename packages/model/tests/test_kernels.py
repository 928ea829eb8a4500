"""Row invariance of every reducing op: the same bits per row whatever else is in the call.

Each property runs in both kernel modes; aligned must always hold, and for standard we
assert that the same checks find at least one difference (the checks can fail).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parity.model import gemm
from parity.model.attention import tree_sum
from parity.model.blas import cnr_mode
from parity.model.devices import ALIGNED, forget_prepared
from parity.model.kernels import STANDARD
from parity.model.layout import KV_TILE, SeqLayout

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _embed(row: torch.Tensor, n: int, j: int, seed: int) -> torch.Tensor:
    """n random rows with `row` at position j."""
    x = torch.randn(n, row.shape[-1], generator=torch.Generator().manual_seed(seed))
    x[j] = row
    return x


@SETTINGS
@given(
    k=st.sampled_from([64, 256, 896, 1024]), n_out=st.sampled_from([97, 256, 768, 1000]),
    n=st.integers(1, 300), data=st.data(),
)
def test_aligned_linear_rows_invariant(k, n_out, n, data):
    j = data.draw(st.integers(0, n - 1))
    threads = data.draw(st.sampled_from([1, 2]))
    g = torch.Generator().manual_seed(k * n_out)
    w, b, row = torch.randn(n_out, k, generator=g), torch.randn(n_out, generator=g), torch.randn(k, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = ALIGNED.linear(row[None], w, b)[0]
        torch.set_num_threads(threads)
        batched = ALIGNED.linear(_embed(row, n, j, n), w, b)[j]
    finally:
        torch.set_num_threads(before)
    assert torch.equal(alone, batched)


# (q rows, k rows, in): a small and a large stacked weight
STACKS = [(64, 16, 96), (1024, 256, 512)]


@pytest.mark.parametrize(("nq", "nk", "k"), STACKS, ids=["small", "large"])
def test_stacked_linears_follow_in_place_weight_changes(nq, nk, k):
    """q/k/v-style stacked linears keep a prepared (stacked, reordered) weight; changing a weight
    in place (an optimizer step, an engine weight update) must make it again: the result equals
    that of fresh tensors holding the new values, bit for bit."""
    g = torch.Generator().manual_seed(0)
    wq, wk, bq, bk = (torch.randn(*s, generator=g) for s in ((nq, k), (nk, k), (nq,), (nk,)))
    x = torch.randn(8, k, generator=g)
    ALIGNED.linears(x, [(wq, bq), (wk, bk)])
    with torch.no_grad():
        wk.mul_(2)  # as an optimizer step does
        wq.copy_(torch.randn(nq, k, generator=g))  # as Engine.update_weights does
    got = ALIGNED.linears(x, [(wq, bq), (wk, bk)])
    want = ALIGNED.linears(x, [(wq.clone(), bq), (wk.clone(), bk)])
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    with torch.no_grad():
        bk.add_(1)  # the stacked bias is kept with the weight: a bias changed alone counts too
    got = ALIGNED.linears(x, [(wq, bq), (wk, bk)])
    want = ALIGNED.linears(x, [(wq.clone(), bq.clone()), (wk.clone(), bk.clone())])
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_forgotten_prepared_weights_are_dropped_and_made_again_alike():
    """`forget_prepared` (a sharded learner resharding) drops the stacked weight prepared
    from these weights; the next call makes it again, with the same bits."""
    g = torch.Generator().manual_seed(0)
    wq, wk = torch.randn(64, 96, generator=g), torch.randn(16, 96, generator=g)
    x = torch.randn(8, 96, generator=g)
    before = ALIGNED.linears(x, [(wq, None), (wk, None)])
    assert wq in gemm._PREPARED
    forget_prepared([wq, wk])
    assert wq not in gemm._PREPARED
    after = ALIGNED.linears(x, [(wq, None), (wk, None)])
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize(("nq", "nk", "k"), STACKS, ids=["small", "large"])
def test_stacked_linear_gradients_match_standard_in_fp32(nq, nk, k):
    """Stacked fp32 linears have the ordinary gradients of each linear: both kernel modes'
    equal float64 autograd's to fp32 rounding (their GEMMs may come from other libraries)."""
    g = torch.Generator().manual_seed(1)
    params = [torch.randn(*s, generator=g, dtype=torch.float64) for s in ((nq, k), (nk, k), (nq,), (nk,))]
    x = torch.randn(13, k, generator=g, dtype=torch.float64)
    r = [torch.randn(13, n, generator=g, dtype=torch.float64) for n in (nq, nk)]

    def grads(linears, dtype):
        xx, *ps = (t.to(dtype).requires_grad_() for t in (x, *params))
        wq, wk, bq, bk = ps
        outs = linears(xx, [(wq, bq), (wk, bk)])
        loss = sum((o * ri.to(dtype)).sum() for o, ri in zip(outs, r, strict=True))
        return torch.autograd.grad(loss, (xx, *ps))

    ref = grads(lambda xx, parts: [xx @ w.t() + b for w, b in parts], torch.float64)
    for kernels in (ALIGNED, STANDARD):
        for got, want in zip(grads(kernels.linears, torch.float32), ref, strict=True):
            torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * float(want.abs().max()))


@pytest.mark.skipif(not gemm.streams_bf16(), reason="bf16 GEMMs stream fp32 weights here (no AMX)")
def test_a_bf16_gemm_on_the_reordered_weight_gives_the_plain_weights_bits() -> None:
    """Where bf16 GEMMs stream bf16, the prepared weight is reordered into oneDNN's blocked
    layout; a call on it gives the bits oneDNN's matmul gives on the plain bf16 weight, at
    every row count a bf16 call has (ROW_TILE..BF16_ROWS), stacked, with a bias and without."""
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    parts = [((torch.randn(96, 64) * 0.1).to(bf16), (torch.randn(96) * 0.1).to(bf16)),
             ((torch.randn(64, 64) * 0.1).to(bf16), None)]
    assert gemm._prepared([w for w, _ in parts], [b for _, b in parts], bf16)[0].layout == \
        torch._mkldnn
    plain_w = torch.cat([w for w, _ in parts])
    plain_b = torch.cat([parts[0][1], torch.zeros(64, dtype=bf16)])
    x = torch.randn(gemm.BF16_ROWS, 64).to(bf16)
    for m in range(gemm.ROW_TILE, gemm.BF16_ROWS + 1, gemm.ROW_TILE):
        plain = gemm.gemm(plain_w.shape[0], torch.nn.functional.linear, x[:m], plain_w, plain_b)
        assert torch.equal(torch.cat(gemm.linears_aligned(x[:m], parts), -1), plain), m
        assert torch.equal(gemm.linear_aligned(x[:m], parts[1][0], None), plain[:, 96:]), m


def test_parity_runs_mkl_in_strict_cnr():
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # MKL settles its mode at its first call
    mode = cnr_mode()
    assert mode is not None and mode & 0x10000, os.environ.get("MKL_CBWR")


_FRESH = """
import json, os
import parity.model
from parity.model import Decoder, ModelConfig, blas
set_by_import = os.environ.get("MKL_CBWR")
cfg = ModelConfig(model_type="qwen2", vocab_size=97, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
Decoder(cfg, "aligned")  # the switch to aligned kernels asks for strict CNR before its proof
print(json.dumps({"set_by_import": set_by_import, "strict": blas.is_strict(blas.cnr_mode())}))
"""


def test_aligned_kernels_not_the_import_put_mkl_in_strict_cnr(tmp_path):
    """A fresh process without MKL_CBWR: importing parity.model leaves the environment alone;
    choosing aligned kernels, before any GEMM has run, gets MKL's strict mode."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    out = subprocess.run([sys.executable, "-c", _FRESH], env=env | {"PARITY_CACHE_DIR": str(tmp_path)},
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"set_by_import": None, "strict": True}


@SETTINGS
@given(h=st.sampled_from([32, 64, 97, 256, 896]), n=st.integers(1, 500), data=st.data())
def test_aligned_rowwise_ops_invariant(h, n, data):
    j = data.draw(st.integers(0, n - 1))
    g = torch.Generator().manual_seed(h + n)
    row, w = torch.randn(h, generator=g) * 3, torch.randn(h, generator=g)
    x = _embed(row, n, j, h)
    assert torch.equal(ALIGNED.rms_norm(row[None], w, 1e-6)[0], ALIGNED.rms_norm(x, w, 1e-6)[j])
    assert torch.equal(ALIGNED.silu_mul(row[None], row[None])[0], ALIGNED.silu_mul(x, x)[j])
    assert torch.equal(ALIGNED.log_softmax(row[None])[0], ALIGNED.log_softmax(x)[j])


def test_standard_silu_is_not_row_invariant():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4099, generator=g) * 4
    whole = STANDARD.silu_mul(x, torch.ones_like(x))
    parts = torch.cat([STANDARD.silu_mul(x[i : i + 7], torch.ones_like(x[i : i + 7])) for i in range(0, 4099, 7)])
    assert not torch.equal(whole, parts)


@pytest.mark.parametrize("n,pad", [(1, 0), (3, 5), (8, 0), (9, 7), (33, 31)])
def test_tree_sum_ignores_zero_padding(n, pad):
    x = torch.randn(4, n, 3)
    padded = torch.cat([x, torch.zeros(4, pad, 3)], dim=1)
    assert torch.equal(tree_sum(x, 1), tree_sum(padded, 1))
    torch.testing.assert_close(tree_sum(x, 1), x.sum(1))


def _qkv(t: int, hq: int, hkv: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, hq, d, generator=g)
    k = torch.randn(t, hkv, d, generator=g)
    v = torch.randn(t, hkv, d, generator=g)
    return q, k, v


def _dense(k: torch.Tensor, length: int) -> torch.Tensor:
    """[T, Hkv, D] keys of one sequence as [1, Hkv, L, D], L padded to the tile with zeros."""
    pad = torch.zeros(length - k.shape[0], *k.shape[1:])
    return torch.cat([k, pad]).transpose(0, 1).unsqueeze(0)


def _attention_prefix_checks(kernels, t: int, hq: int, hkv: int, d: int, seed: int) -> list[bool]:
    """For every query t: row t of the full causal call == query t alone against keys 0..t."""
    q, k, v = _qkv(t, hq, hkv, d, seed)
    length = (t + KV_TILE - 1) // KV_TILE * KV_TILE
    full = kernels.attention(q, _dense(k, length), _dense(v, length), SeqLayout.from_lengths([t]), d**-0.5)
    same = []
    for i in range(t):
        li = (i + 1 + KV_TILE - 1) // KV_TILE * KV_TILE
        one = kernels.attention(
            q[i : i + 1], _dense(k[: i + 1], li), _dense(v[: i + 1], li),
            SeqLayout.from_lengths([1], [i]), d**-0.5,
        )
        same.append(torch.equal(full[i], one[0]))
    return same


@settings(max_examples=12, deadline=None)
@given(t=st.integers(1, 100), heads=st.sampled_from([(4, 2), (4, 4), (14, 2), (2, 1)]),
       d=st.sampled_from([32, 64]), seed=st.integers(0, 99))
def test_aligned_attention_row_equals_prefix_query(t, heads, d, seed):
    assert all(_attention_prefix_checks(ALIGNED, t, *heads, d, seed))


def test_standard_attention_differs_somewhere():
    assert not all(_attention_prefix_checks(STANDARD, 150, 4, 2, 64, 0))


@SETTINGS
@given(lengths=st.lists(st.integers(1, 90), min_size=2, max_size=6), seed=st.integers(0, 99))
def test_aligned_attention_batch_invariant(lengths, seed):
    """A sequence's attention output is the same alone and among others of any lengths."""
    hq, hkv, d = 4, 2, 32
    seqs = [_qkv(n, hq, hkv, d, seed + i) for i, n in enumerate(lengths)]
    length = (max(lengths) + KV_TILE - 1) // KV_TILE * KV_TILE
    q = torch.cat([s[0] for s in seqs])
    k = torch.cat([_dense(s[1], length) for s in seqs])
    v = torch.cat([_dense(s[2], length) for s in seqs])
    together = ALIGNED.attention(q, k, v, SeqLayout.from_lengths(lengths), d**-0.5)
    start = 0
    for (qs, ks, vs), n in zip(seqs, lengths, strict=True):
        ln = (n + KV_TILE - 1) // KV_TILE * KV_TILE
        alone = ALIGNED.attention(qs, _dense(ks, ln), _dense(vs, ln), SeqLayout.from_lengths([n]), d**-0.5)
        assert torch.equal(alone, together[start : start + n])
        start += n


def test_aligned_gradients_match_standard():
    torch.manual_seed(0)
    hq, hkv, d, t = 4, 2, 16, 70
    q, k, v = (x.double().requires_grad_() for x in _qkv(t, hq, hkv, d, 3))
    w = torch.randn(24, hq * d, dtype=torch.float64, requires_grad=True)
    layout = SeqLayout.from_lengths([t])
    length = 128

    def loss(kernels):
        o = kernels.attention(q, _dense(k, length), _dense(v, length), layout, d**-0.5)
        return kernels.linear(o.reshape(t, -1), w, None).square().sum()

    grads = {}
    for kernels in (ALIGNED, STANDARD):
        grads[kernels.mode] = torch.autograd.grad(loss(kernels), (q, k, v, w))
    for a, b in zip(grads["aligned"], grads["standard"], strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("shape", [(7, 32), (5, 3, 16)])  # hidden states; per-head q/k norm
def test_aligned_norm_and_silu_gradients_match_standard(shape):
    g = torch.Generator().manual_seed(1)
    x, up = (torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    w = torch.rand(shape[-1], generator=g, dtype=torch.float64).add(0.5).requires_grad_()
    grads = {}
    for kernels in (ALIGNED, STANDARD):
        out = kernels.silu_mul(kernels.rms_norm(x, w, 1e-6), up)
        grads[kernels.mode] = torch.autograd.grad(out.square().sum(), (x, w, up))
    for a, b in zip(grads["aligned"], grads["standard"], strict=True):
        torch.testing.assert_close(a, b)


def test_aligned_gradients_match_finite_differences():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(4, 6, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ALIGNED.linear(a, b, None), (x, w))
    w2, b1, b2 = (torch.randn(*s, dtype=torch.float64, generator=g, requires_grad=True)
                  for s in ((3, 6), (4,), (3,)))
    # gradcheck perturbs its inputs through .data, which a prepared weight cannot see (its
    # version counter stays put): fresh clones per call
    assert torch.autograd.gradcheck(
        lambda a, b, c, d, e: torch.cat(ALIGNED.linears(a, [(b.clone(), d), (c.clone(), e)]), -1),
        (x, w, w2, b1, b2),
    )
    q, k, v = (t.double().requires_grad_() for t in _qkv(5, 2, 1, 4, 1))
    layout = SeqLayout.from_lengths([5])
    assert torch.autograd.gradcheck(
        lambda a, b, c: ALIGNED.attention(a, _dense(b, 64), _dense(c, 64), layout, 0.5), (q, k, v)
    )


def test_rms_norm_is_the_formula_to_fp32_rounding():
    # whichever path serves it here (one C pass per row, or torch's ops): within a few
    # roundings of the float64 formula, for widths on both paths (896 = 56 x 16; 97 is not)
    g = torch.Generator().manual_seed(3)
    for h in (896, 97):
        x, w = torch.randn(37, h, generator=g) * 3, torch.randn(h, generator=g)
        y = ALIGNED.rms_norm(x, w, 1e-6).double()
        xd = x.double()
        ref = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        assert (y - ref).abs().max() <= 4 * torch.finfo(torch.float32).eps * ref.abs().max()


def test_silu_mul_is_the_formula_to_fp32_rounding():
    # gate and up as the MLP has them (column slices of one GEMM output), widths on both
    # paths (768 = 48 x 16; 97 is not)
    g = torch.Generator().manual_seed(4)
    for width in (768, 97):
        both = torch.randn(33, 2 * width, generator=g) * 6
        gate, up = both[:, :width], both[:, width:]
        y = ALIGNED.silu_mul(gate, up).double()
        gd = gate.double()
        ref = gd * torch.sigmoid(gd) * up.double()
        assert ((y - ref).abs() <= 4 * torch.finfo(torch.float32).eps * ref.abs()).all()
