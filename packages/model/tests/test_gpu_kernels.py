"""The GPU kernel set (`parity.model.gpu`) under Triton's interpreter: no GPU needed.

Triton reads TRITON_INTERPRET when a kernel is decorated, so it is set before the set is first
imported (nothing else in the test session imports it, or runs Triton kernels). The interpreter
proves the kernels' structure (fixed tiles, masks, loop bounds, no batch-dependent split) with
numpy arithmetic, not a GPU's bits: `scripts/gpu_check.py` proves those on a device. Invariance
is always `torch.equal`; only the comparison with the standard ops uses a tolerance.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from parity.model.devices import ALIGNED, get_kernels
from parity.model.gpu import KERNELS
from parity.model.gpu.attention import _attention_kernel, paged_attention
from parity.model.gpu.controls import split_k_linear
from parity.model.gpu.device import unavailable
from parity.model.gpu.launch import interpreted
from parity.model.kernels import STANDARD, AlignmentError
from parity.model.layout import KV_TILE, SeqLayout

ROWS = (1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 255)
REPO = Path(__file__).resolve().parents[3]

if not interpreted(_attention_kernel):
    pytest.skip("parity.model.gpu was imported before TRITON_INTERPRET=1 was set",
                allow_module_level=True)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _differing_rows(op: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, seed: int
                    ) -> list[int]:
    """The row counts m of ROWS for which op on m of x's rows, taken at a random offset and in a
    random order, does not equal those rows of op on all of x."""
    g = _gen(seed)
    ref = op(x)
    bad = []
    for m in ROWS:
        o = int(torch.randint(0, x.shape[0] - m + 1, (1,), generator=g))
        perm = o + torch.randperm(m, generator=g)
        if not torch.equal(op(x[perm]), ref[perm]):
            bad.append(m)
    return bad


# ----------------------------------------------------------------------------- row-wise ops


def test_linear_rows_are_invariant() -> None:
    g = _gen(1)
    w, b = torch.randn(96, 80, generator=g), torch.randn(96, generator=g)
    x = torch.randn(300, 80, generator=g)
    assert _differing_rows(lambda t: KERNELS.linear(t, w, b), x, 2) == []


def test_stacked_linears_are_invariant_in_bfloat16() -> None:
    # the interpreter widens bf16 tiles to fp32 before the dot (launch.py): the rounding
    # points (weights and output in bf16, bias in fp32) are the kernel's own
    g = _gen(3)
    parts = [(torch.randn(48, 64, generator=g), torch.randn(48, generator=g)),
             (torch.randn(16, 64, generator=g), None)]
    x = torch.randn(300, 64, generator=g).bfloat16()
    assert _differing_rows(lambda t: torch.cat(KERNELS.linears(t, parts), -1), x, 4) == []


@pytest.mark.parametrize("op", ["rms_norm", "silu_mul", "log_softmax"])
def test_rowwise_rows_are_invariant(op: str) -> None:
    g = _gen(5)
    w = torch.rand(80, generator=g) + 0.5
    fn = {"rms_norm": lambda t: KERNELS.rms_norm(t, w, 1e-6),
          "silu_mul": lambda t: KERNELS.silu_mul(t, t.flip(-1)),
          "log_softmax": KERNELS.log_softmax}[op]
    assert _differing_rows(fn, 3 * torch.randn(300, 80, generator=g), 6) == []


def test_split_k_control_is_caught() -> None:
    """The negative control: a GEMM that splits K for calls of few rows must be found to
    differ by the same check that passes the set's GEMM."""
    g = _gen(7)
    w, x = torch.randn(96, 256, generator=g), torch.randn(300, 256, generator=g)
    bad = _differing_rows(lambda t: split_k_linear(t, w), x, 8)
    assert bad and max(bad) < 16, bad


def test_rowwise_ops_match_standard() -> None:
    g = _gen(9)
    x, w, b = torch.randn(37, 80, generator=g), torch.randn(96, 80, generator=g), torch.randn(96, generator=g)
    n = torch.rand(80, generator=g) + 0.5
    pairs = [(KERNELS.linear(x, w, b), STANDARD.linear(x, w, b)),
             (KERNELS.rms_norm(x, n, 1e-6), STANDARD.rms_norm(x, n, 1e-6)),
             (KERNELS.silu_mul(x, x.flip(-1)), STANDARD.silu_mul(x, x.flip(-1))),
             (KERNELS.log_softmax(4 * x), STANDARD.log_softmax(4 * x))]
    for got, want in pairs:
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    xb = x.bfloat16()
    want = (xb.float() @ w.bfloat16().float().T + b.bfloat16().float()).bfloat16()
    assert (KERNELS.linear(xb, w, b).float() - want.float()).abs().max() <= 2 ** -6 * want.float().abs().max()


def test_backward_matches_standard() -> None:
    g = _gen(10)
    x = torch.randn(6, 32, generator=g, requires_grad=True)
    w = torch.randn(40, 32, generator=g, requires_grad=True)
    n = (torch.rand(40, generator=g) + 0.5).requires_grad_()
    grads = []
    for k in (KERNELS, STANDARD):
        h = k.rms_norm(k.linear(x, w, None), n, 1e-6)
        k.log_softmax(k.silu_mul(h, h.flip(-1))).sum().backward()
        grads.append([t.grad.clone() for t in (x, w, n)])
        for t in (x, w, n):
            t.grad = None
    for got, want in zip(*grads, strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- attention

HQ, HKV, D = 4, 2, 16
SCALE = D**-0.5


def _qkv(t: int, seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = _gen(seed)
    return tuple(torch.randn(t, h, D, generator=g).to(dtype) for h in (HQ, HKV, HKV))


def _dense(x: torch.Tensor, n: int, length: int | None = None) -> torch.Tensor:
    """A sequence's first n keys [T, Hkv, D] as [1, Hkv, L, D] (L: `length`, by default n
    rounded up to KV_TILE), zero past n, as a KV store hands them over."""
    out = x.new_zeros(length or -(-n // KV_TILE) * KV_TILE, *x.shape[1:])
    out[:n] = x[:n]
    return out.transpose(0, 1).unsqueeze(0)


def _call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """Rows start..start+n of one sequence in one call, its first start keys cached."""
    layout = SeqLayout.from_lengths([n], [start])
    return KERNELS.attention(q[start:start + n], _dense(k, start + n), _dense(v, start + n),
                             layout, SCALE)


@pytest.fixture(scope="module")
def seq() -> tuple[torch.Tensor, ...]:
    """A 150-token sequence (three key tiles) and its prefill output."""
    q, k, v = _qkv(150, 11)
    return q, k, v, _call(q, k, v, 0, 150)


def test_attention_matches_standard(seq: tuple[torch.Tensor, ...]) -> None:
    q, k, v, ref = seq
    want = STANDARD.attention(q, _dense(k, 150), _dense(v, 150), SeqLayout.from_lengths([150]), SCALE)
    assert torch.allclose(ref, want, rtol=1e-4, atol=1e-5)


def test_decode_of_every_position_equals_prefill(seq: tuple[torch.Tensor, ...]) -> None:
    """All 150 positions decoded in one batch, each a one-row sequence at its own position."""
    q, k, v, ref = seq
    t = q.shape[0]
    layout = SeqLayout.from_lengths([1] * t, list(range(t)))
    keys, values = (_dense(x, t).expand(t, -1, -1, -1) for x in (k, v))
    assert torch.equal(KERNELS.attention(q, keys, values, layout, SCALE), ref)


@pytest.mark.parametrize("chunk", [1, 7, 64, 65])
def test_chunked_prefill_equals_prefill(seq: tuple[torch.Tensor, ...], chunk: int) -> None:
    q, k, v, ref = seq
    stop = 80 if chunk == 1 else q.shape[0]  # chunk 1 is decode: across the first tile boundary
    out = torch.cat([_call(q, k, v, a, min(chunk, stop - a)) for a in range(0, stop, chunk)])
    assert torch.equal(out, ref[:stop])


@pytest.mark.parametrize("cached", [37, 64, 100, 149])
def test_prefix_continuation_equals_prefill(seq: tuple[torch.Tensor, ...], cached: int) -> None:
    q, k, v, ref = seq
    assert torch.equal(_call(q, k, v, cached, q.shape[0] - cached), ref[cached:])


def test_sequence_among_others_in_any_order(seq: tuple[torch.Tensor, ...]) -> None:
    """The sequence in one call with others of other lengths and offsets, in two orders."""
    q, k, v, ref = seq
    others = [(_qkv(n + off, 20 + n), n, off) for n, off in ((5, 0), (70, 30), (1, 99), (33, 64))]
    pieces = [((q, k, v), 150, 0), *others]
    for order in ([0, 1, 2, 3, 4], [3, 1, 4, 0, 2]):
        chosen = [pieces[i] for i in order]
        length = -(-max(n + off for _, n, off in chosen) // KV_TILE) * KV_TILE
        qs = torch.cat([x[0][off:off + n] for x, n, off in chosen])
        ks, vs = (torch.cat([_dense(x[j], n + off, length) for x, n, off in chosen])
                  for j in (1, 2))
        layout = SeqLayout.from_lengths([n for _, n, _ in chosen], [off for _, _, off in chosen])
        out = KERNELS.attention(qs, ks, vs, layout, SCALE)
        at = layout.starts[order.index(0)]
        assert torch.equal(out[at:at + 150], ref)


def test_attention_rows_are_invariant() -> None:
    """Rows of a 300-token sequence computed in calls of m rows (ROWS), continuing at a
    random offset, equal the same rows of its prefill."""
    q, k, v = _qkv(300, 12)
    ref = _call(q, k, v, 0, 300)
    g = _gen(13)
    for m in ROWS:
        a = int(torch.randint(0, 300 - m + 1, (1,), generator=g))
        assert torch.equal(_call(q, k, v, a, m), ref[a:a + m]), m


def test_paged_cache_equals_dense(seq: tuple[torch.Tensor, ...]) -> None:
    """The same keys in a paged cache (blocks of 16 in shuffled order): the same bits, for a
    prefill and for decode steps of two sequences at once."""
    q, k, v, ref = seq
    bs, blocks = 16, 150 // 16 + 1
    order = torch.randperm(blocks + 3, generator=_gen(14))[:blocks]
    cache = [torch.zeros(blocks + 3, HKV, bs, D) for _ in (k, v)]
    for c, x in zip(cache, (k, v), strict=True):
        padded = torch.cat([x, x.new_zeros(blocks * bs - 150, HKV, D)])
        c[order] = padded.view(blocks, bs, HKV, D).transpose(1, 2)
    prefill = paged_attention(q, *cache, order[None], SeqLayout.from_lengths([150]), SCALE)
    assert torch.equal(prefill, ref)
    decode = paged_attention(q[[17, 149]], *cache, order[None].expand(2, -1),
                             SeqLayout.from_lengths([1, 1], [17, 149]), SCALE)
    assert torch.equal(decode, ref[[17, 149]])


def test_attention_paths_agree_in_bfloat16() -> None:
    q, k, v = _qkv(80, 15, torch.bfloat16)
    ref = _call(q, k, v, 0, 80)
    assert ref.dtype == torch.bfloat16
    assert torch.equal(torch.cat([_call(q, k, v, 0, 63), _call(q, k, v, 63, 1), _call(q, k, v, 64, 16)]), ref)


# ----------------------------------------------------------------------------- dispatch


def test_cpu_tensors_keep_the_cpu_path() -> None:
    from parity.model.gemm import linear_aligned
    from parity.model.rowwise import rms_norm_aligned

    g = _gen(16)
    x, w, n = torch.randn(5, 64, generator=g), torch.randn(32, 64, generator=g), torch.rand(64, generator=g)
    assert torch.equal(ALIGNED.linear(x, w, None), linear_aligned(x, w, None))
    assert torch.equal(ALIGNED.rms_norm(x, n, 1e-6), rms_norm_aligned(x, n, 1e-6))
    assert torch.equal(ALIGNED.log_softmax(x), torch.log_softmax(x, -1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_aligned_on_cuda_refused_without_a_device() -> None:
    assert "no CUDA device" in (unavailable("cuda") or "")
    with pytest.raises(AlignmentError, match="aligned kernels refused on cuda: no CUDA device") as e:
        get_kernels("aligned", "cuda")
    assert "\n" not in str(e.value)
    assert get_kernels("standard", "cuda") is STANDARD
    assert get_kernels("aligned", "cpu") is ALIGNED


def test_device_proof_moves_the_probes_and_reports_failures() -> None:
    """The device proof's wrapper hands the CPU proof's fp32 tensors to the set in the probed
    dtype; a kernel that cannot run there fails the verdict with its cause."""
    from dataclasses import replace

    from parity.model.gpu.selfcheck import on_device, verify_device
    from parity.model.selfcheck import Shapes

    g = _gen(17)
    x, w, b = torch.randn(5, 64, generator=g), torch.randn(32, 64, generator=g), torch.randn(32, generator=g)
    got = on_device(KERNELS, torch.device("cpu"), torch.bfloat16).linear(x, w, b)
    assert got.dtype == torch.float32
    assert torch.equal(got, KERNELS.linear(x.bfloat16(), w.bfloat16(), b.bfloat16()).float())

    def broken(*_: object) -> torch.Tensor:
        raise RuntimeError("out of resource: shared memory")

    verdict = verify_device(Shapes(((64, 32, False),), (2, 1, 16), (64,), 32, 97),
                            torch.device("cpu"), replace(KERNELS, linear=broken))
    assert not verdict.ok and "out of resource" in verdict.failure


def test_gpu_check_smoke() -> None:
    """scripts/gpu_check.py --smoke: every check of the GPU run, at tiny shapes under the
    interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = ("import runpy, sys; "
            "sys.argv = ['gpu_check.py', '--smoke']; "
            "runpy.run_path('scripts/gpu_check.py', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    report = json.loads(done.stdout)
    assert report["ok"], report
