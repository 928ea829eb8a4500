"""The GPU set's GEMM: y = x @ w.T + b with one tile shape per dtype and no split-K.

A row's bits are fixed by construction. Each program computes one BLOCK_M x BLOCK_N output tile
by walking the whole K dimension in BLOCK_K steps, in order, into one fp32 accumulator; the
tile shape, warps and stages depend on the dtype alone, never on M, and nothing is autotuned.
A row of x therefore meets the same instructions in the same order whether the call has 1 row
or 10,000 and wherever the row sits: the row count only changes how many programs run, and
rows past M are masked zeros that no other row reads. fp32 operands use IEEE fp32 products
(`input_precision="ieee"`, never TF32); bf16 operands use the tensor cores' exact bf16
products with fp32 accumulation, the output rounded once to the input's dtype.

Linears that read one input (q/k/v, gate/up) run as one GEMM over their weights stacked by
output, prepared once per weight version (rounded to the compute dtype, as the CPU set does),
so the learner's fp32 masters and the engine's bf16 weights give one prepared operand. The
backward is ordinary torch matmuls: only the forward's bits are promised.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import triton
import triton.language as tl
from torch.utils.weak import WeakIdKeyDictionary

from parity.model.gpu.launch import OPTIONS, interpreted, rows

Part = tuple[torch.Tensor, torch.Tensor | None]  # a linear's weight [out, k] and bias [out]

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) per operand dtype: the only tile each dtype uses
TILES: dict[torch.dtype, tuple[int, int, int, int, int]] = {
    torch.float32: (64, 64, 32, 4, 3),
    torch.bfloat16: (64, 128, 64, 4, 3),
}


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, sxm, swn, sym,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * sxm
    w_cols = w_ptr + rn.to(tl.int64)[None, :] * swn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # the whole K, in order: no split, whatever M is
        k_ok = k0 + rk < K
        a = tl.load(x_rows + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_cols + (k0 + rk)[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if DOT_FP32:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0)[None, :]
    y = y_ptr + rm.to(tl.int64)[:, None] * sym + rn[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def gemm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K].T (+ b [N], fp32) in fp32, rounded to `out_dtype` (x's by default);
    x and w of one dtype, each with a unit-stride last dimension."""
    if x.dtype != w.dtype or x.dtype not in TILES:
        raise TypeError(f"GPU GEMM operands must both be float32 or bfloat16, not {x.dtype}, {w.dtype}")
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    if m == 0:
        return y
    bm, bn, bk, warps, stages = TILES[x.dtype]
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _gemm_kernel[grid](x, w, y if b is None else b, y, m, n, k, x.stride(0), w.stride(0),
                       y.stride(0), HAS_BIAS=b is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                       DOT_FP32=x.dtype != torch.float32 and interpreted(_gemm_kernel),
                       num_warps=warps, num_stages=stages, **OPTIONS)
    return y


# first weight of a stack -> (dtype, identity, version and storage of each weight and bias;
# the prepared stacked weight and bias)
_PREPARED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def forget(weights: Iterable[torch.Tensor]) -> None:
    """Drop the prepared copies made from `weights` (`parity.model.gemm.forget`)."""
    for w in weights:
        _PREPARED.pop(w, None)


def prepared(parts: Sequence[Part], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The parts' weights rounded to `dtype` and stacked by output [sum(out), k], and their
    biases rounded to `dtype`, in fp32 (None if none has one); made again after any of them
    changes in place (a bumped version counter or new storage, as `parity.model.gemm`)."""
    tensors = [t for part in parts for t in part if t is not None]
    key = (dtype, *((id(t), t._version, t.data_ptr()) for t in tensors))
    hit = _PREPARED.get(parts[0][0])
    if hit is None or hit[0] != key:
        with torch.no_grad():
            w = torch.cat([p[0].detach().to(dtype) for p in parts]).contiguous()
            b = None
            if any(p[1] is not None for p in parts):
                b = torch.cat([p[0].new_zeros(p[0].shape[0]) if p[1] is None else p[1].detach()
                               for p in parts]).to(dtype).float()
        hit = key, (w, b)
        _PREPARED[parts[0][0]] = hit
    return hit[1]


class _Linears(torch.autograd.Function):
    """The stacked GEMM forward; ordinary torch gradients for backward."""

    @staticmethod
    def forward(ctx, flat: torch.Tensor, n: int, *params: torch.Tensor | None) -> torch.Tensor:  # type: ignore[override]
        parts = list(zip(params[:n], params[n:], strict=True))
        w, b = prepared(parts, flat.dtype)
        ctx.save_for_backward(flat, w)
        ctx.sizes = [p[0].shape[0] for p in parts]
        ctx.dtypes = [(p[0].dtype, None if p[1] is None else p[1].dtype) for p in parts]
        return gemm(flat, w, b)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        flat, w = ctx.saved_tensors
        grad = grad.to(flat.dtype)
        gws = (grad.t() @ flat).split(ctx.sizes)
        grads = grad.split(ctx.sizes, dim=-1)
        gw = [g.to(wd) for g, (wd, _) in zip(gws, ctx.dtypes, strict=True)]
        gb = [None if bd is None else g.sum(0).to(bd) for g, (_, bd) in zip(grads, ctx.dtypes, strict=True)]
        return grad @ w, None, *gw, *gb


def linears(x: torch.Tensor, parts: Sequence[Part]) -> list[torch.Tensor]:
    """x [..., k] times each (w, b) of `parts`, as one GEMM over the stacked weights, computed
    in x's dtype (fp32 or bf16); the outputs are column slices of that GEMM's result."""
    flat = rows(x)
    params = [p[0] for p in parts] + [p[1] for p in parts]
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (flat, *params)):
        y = _Linears.apply(flat, len(parts), *params)
    else:
        y = gemm(flat, *prepared(parts, flat.dtype))
    outs = y.split([p[0].shape[0] for p in parts], -1)
    return [o.view(*x.shape[:-1], o.shape[-1]) for o in outs]


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return linears(x, [(w, b)])[0]
