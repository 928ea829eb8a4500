"""Aligned GEMMs: one shape class per weight, the same for every caller.

Rows are zero-padded to a multiple of ROW_TILE, so no caller reaches the special paths BLAS
libraries keep for 1-3 row calls (GEMV, small-n kernels: on AMD they differ from the rest even
in MKL's strict CNR mode). A call runs on at most `columns // COLUMNS_PER_THREAD` BLAS threads,
so no thread is handed a sliver of output columns narrower than a vector (MKL computes those on
other paths, measured on AMD at 2-32 threads). That the BLAS keeps one reduction order per row
within this class is proved per machine (`parity.model.selfcheck`); see docs/parity.md.

Linears that read the same input (q/k/v; gate/up) are one GEMM over their weights stacked by
output: one pass over the input and one call instead of three or two. fp32 linears run on
oneDNN with that stacked weight reordered once into the blocked layout oneDNN picks for
ROW_TILE-row inputs, kept until a weight changes in place: MKL's fp32 GEMM re-packs the whole
weight on every call, which left decode's few-row GEMMs compute-bound at about half the memory
bandwidth, and on AMD it ran the small GEMMs of the embedded model at half oneDNN's speed
(docs/benchmarks-engine.md). Every caller, the learner's forward included, gets the same
prepared weight and so the same kernel; oneDNN picks its kernels by ISA flags, not by CPU
vendor. Other dtypes, and torch builds without oneDNN, run the stacked weight on MKL.

In bfloat16 (x is bf16) the GEMM is this same fp32 GEMM on the bf16 values: the weights are
rounded to bf16 once when prepared (fp32 masters and bf16 weights give the same prepared
weight), products of bf16 values are exact in fp32, the fp32 accumulation keeps its proved
order, and the output is rounded to bf16 once. Learner and engine thus agree bit for bit in
bf16 for the same reason as in fp32, on every CPU, whatever its bf16 instructions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from parity.model.blas import set_local_threads

ROW_TILE = 8  # rows of every aligned GEMM operand are a multiple of this
COLUMNS_PER_THREAD = 64  # an aligned GEMM runs on at most out_columns // this BLAS threads
ONEDNN = torch.backends.mkldnn.is_available()

Part = tuple[torch.Tensor, torch.Tensor | None]  # a linear's weight [out, k] and bias [out]


def pad_rows(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """x with zero rows appended along `dim` up to a multiple of ROW_TILE (x itself if none)."""
    pad = -x.shape[dim] % ROW_TILE
    if not pad:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_zeros(shape)], dim)


def gemm(columns: int, fn: Callable[..., torch.Tensor], *args: torch.Tensor | None) -> torch.Tensor:
    """fn(*args) on at most columns // COLUMNS_PER_THREAD BLAS threads (at least one), where
    `columns` counts the call's output columns over all its matrices."""
    cap = columns // COLUMNS_PER_THREAD
    if cap >= torch.get_num_threads():
        return fn(*args)
    before = set_local_threads(max(cap, 1))
    try:
        return fn(*args)
    finally:
        set_local_threads(before)


def _on_onednn(dtype: torch.dtype) -> bool:
    # oneDNN's reordered layouts are proved for fp32 operands (those of fp32 and bf16 models);
    # the choice depends on the dtype alone, so every caller of a weight gets the same kernel
    return ONEDNN and accumulation_dtype(dtype) == torch.float32


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """What aligned ops compute in for inputs of `dtype`: fp32 for bf16, else `dtype` itself."""
    return torch.float32 if dtype == torch.bfloat16 else dtype


def _rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t's values rounded to `dtype`, held in its accumulation dtype (the GEMMs' operands)."""
    return t.detach().to(dtype).to(accumulation_dtype(dtype))


# first weight of a stack -> (identity, version and storage of each weight and the dtype when
# prepared, the prepared stacked weight)
_PREPARED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _prepared(ws: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The weights rounded to `dtype`, in fp32, stacked by output and, on oneDNN, reordered
    for ROW_TILE-row inputs; made again after any of them changes in place. Seen: changes
    that bump a tensor's version counter (copy_ and other in-place ops, load_state_dict,
    torch.optim's default and foreach steps) or swap its storage. Not seen: in-place writes
    through `.data` and `torch.optim.AdamW(fused=True)`, which leave the counter alone."""
    key = (dtype, *((id(w), w._version, w.data_ptr()) for w in ws))
    hit = _PREPARED.get(ws[0])
    if hit is None or hit[0] != key:
        with torch.no_grad():
            w = torch.cat([_rounded(w, dtype) for w in ws]) if len(ws) > 1 else _rounded(ws[0], dtype)
            if _on_onednn(dtype):
                w = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), ROW_TILE)
        hit = key, w
        _PREPARED[ws[0]] = hit
    return hit[1]


def _stacked_bias(ws: Sequence[torch.Tensor], bs: Sequence[torch.Tensor | None], dtype: torch.dtype
                  ) -> torch.Tensor | None:
    if all(b is None for b in bs):
        return None
    return torch.cat([w.new_zeros(w.shape[0], dtype=accumulation_dtype(dtype)) if b is None else _rounded(b, dtype)
                      for w, b in zip(ws, bs, strict=True)])


def _forward(flat: torch.Tensor, ws: Sequence[torch.Tensor], bs: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """flat [M, k] (M a multiple of ROW_TILE) times the stacked weights, plus their biases,
    computed in fp32 on flat's values and the weights rounded to flat's dtype; the result is
    rounded to flat's dtype."""
    dtype = flat.dtype
    w, b = _prepared(ws, dtype), _stacked_bias(ws, bs, dtype)
    x = flat.to(accumulation_dtype(dtype))
    if _on_onednn(dtype):
        y = torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    else:
        y = gemm(w.shape[0], F.linear, x, w, b)
    return y.to(dtype)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [m, k] @ b [k, n] for gradients, which need to be correct, not row-invariant: on
    oneDNN for fp32 (as b's transpose, a plain weight), where MKL ran the learner's backward
    GEMMs at under half oneDNN's speed on AMD Zen 5 (docs/benchmarks.md), else torch's."""
    if not _on_onednn(a.dtype):
        return a @ b
    return torch.ops.mkldnn._linear_pointwise(a.contiguous(), b.t().contiguous(), None, "none", [], "")


class _Linears(torch.autograd.Function):
    """The stacked forward; the ordinary gradients of each linear for backward."""

    @staticmethod
    def forward(ctx, flat: torch.Tensor, n: int, *params: torch.Tensor | None) -> torch.Tensor:  # type: ignore[override]
        ws, bs = params[:n], params[n:]
        ctx.save_for_backward(flat, *ws)
        ctx.bias_dtypes = [None if b is None else b.dtype for b in bs]
        return _forward(flat, ws, bs)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        # in fp32, with the weights as the forward used them; each gradient in its input's
        # dtype; one GEMM for the input's gradient and one for all the weights' (stacked)
        flat, *ws = ctx.saved_tensors
        dtype = flat.dtype
        x = flat.to(accumulation_dtype(dtype))
        grad = grad.to(x.dtype)
        w = torch.cat([_rounded(w, dtype) for w in ws]) if len(ws) > 1 else _rounded(ws[0], dtype)
        gx = _matmul(grad, w)
        gws = _matmul(grad.t(), x).split([w.shape[0] for w in ws])
        grads = grad.split([w.shape[0] for w in ws], dim=-1)
        gbs = [None if dt is None else g.sum(0).to(dt) for g, dt in zip(grads, ctx.bias_dtypes, strict=True)]
        return gx.to(dtype), None, *(g.to(w.dtype) for g, w in zip(gws, ws, strict=True)), *gbs


def linears_aligned(x: torch.Tensor, parts: Sequence[Part]) -> list[torch.Tensor]:
    """x [..., k] times each (w, b) of `parts`, as one GEMM over the stacked weights; the
    outputs are column slices of that GEMM's result."""
    # A multiple of ROW_TILE rows reaches the BLAS whatever the caller's count.
    flat = pad_rows(x.reshape(-1, x.shape[-1])).contiguous()
    ws, bs = [w for w, _ in parts], [b for _, b in parts]
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (flat, *ws, *bs)):
        y = _Linears.apply(flat, len(ws), *ws, *bs)
    else:
        y = _forward(flat, ws, bs)
    rows = x.numel() // x.shape[-1]
    return [o.view(*x.shape[:-1], o.shape[-1]) for o in y[:rows].split([w.shape[0] for w in ws], -1)]


def linear_aligned(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return linears_aligned(x, [(w, b)])[0]
