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

In bfloat16 (x is bf16), on a CPU with AMX and oneDNN (`streams_bf16`), the GEMM streams bf16: the weights are rounded to bf16 once when prepared (fp32 masters and bf16
weights give the same prepared weight) and reordered, as fp32 weights are, into oneDNN's
blocked layout, and oneDNN's bf16 matmul multiplies them in calls of at most BF16_ROWS rows,
accumulating in fp32 and rounding each output to bf16 once. Its kernel for 2..63 rows keeps one
reduction order per row (at 64 rows and more, and at 1, it switches kernels: measured on
Sapphire Rapids, and proved per machine like the fp32 class). A decode step thus reads half the
bytes of the fp32 path, and a prefill runs at bf16 speed (2x the fp32 GEMM at 1,024 rows on
Sapphire Rapids). The reordered weight gives the bits of the plain one (oneDNN's matmul on
it, as before: every 0.5B shape, 8-32 rows, 1 and 2 threads, Sapphire Rapids) in 0.5-0.7x
its time at 8 rows, where the plain weight was repacked on every call; it is a copy where a
bf16 weight was used as it is (the fp32 path's trade). Elsewhere the
GEMM is the fp32 GEMM on the bf16 values (products of bf16 values are exact in
fp32, the fp32 accumulation keeps its proved order, the output is rounded to bf16 once). Either
way learner and engine run the same path on one machine and agree bit for bit; nodes compare
fingerprints, which cover the path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from parity.model.blas import set_local_threads

ROW_TILE = 8  # rows of every aligned GEMM operand are a multiple of this
COLUMNS_PER_THREAD = 64  # an aligned GEMM runs on at most out_columns // this BLAS threads
BF16_ROWS = 32  # a bf16-streaming GEMM call has ROW_TILE..this many rows (one oneDNN kernel)
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
    # oneDNN's reordered layouts are proved for fp32 operands (those of fp32 and bf16 models)
    # and for the bf16 operands of a GEMM that streams bf16 (`_native`);
    # the choice depends on the dtype alone, so every caller of a weight gets the same kernel
    return ONEDNN and accumulation_dtype(dtype) == torch.float32


@functools.cache
def streams_bf16() -> bool:
    """Whether bf16 GEMMs stream bf16 weights here: oneDNN and AMX's bf16 tiles, the kernels
    whose row invariance was measured (Sapphire Rapids). AVX512-BF16 without AMX (AMD Zen 4/5,
    Cooper Lake) keeps the fp32 path until its kernels are measured too."""
    from parity.model.dtypes import bf16_support

    s = bf16_support()
    return ONEDNN and bool(s["amx_bf16"]) and bool(s["onednn_bf16"])


def _native(dtype: torch.dtype) -> bool:
    return dtype == torch.bfloat16 and streams_bf16()


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """What aligned ops compute in for inputs of `dtype`: fp32 for bf16, else `dtype` itself."""
    return torch.float32 if dtype == torch.bfloat16 else dtype


def _rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t's values rounded to `dtype`, held in its accumulation dtype (the GEMMs' operands)."""
    return t.detach().to(dtype).to(accumulation_dtype(dtype))


def _operand_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the forward GEMM reads weights in for inputs of `dtype`: bf16 where it streams
    bf16, else the accumulation dtype."""
    return dtype if _native(dtype) else accumulation_dtype(dtype)


def _operand(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A weight or bias rounded to `dtype`, as the forward GEMM reads it (a bf16 tensor
    itself where the GEMM streams bf16, not a copy)."""
    return t.detach().to(dtype).to(_operand_dtype(dtype))


class OneDnnGemm:
    """How oneDNN GEMMs hold a prepared weight and run it: torch's `mkldnn` ops, the weight
    reordered once for ROW_TILE-row inputs and the primitive looked up at each call. A process
    may swap in another route to the same oneDNN matmul (`use_onednn`: vLLM's per-weight
    handle in a vLLM worker, which skips the per-call lookup) where it gives these bits."""

    name = "torch mkldnn"

    def prepare(self, w: torch.Tensor) -> object:
        """The form `run` reads of a stacked weight `w` [out, k] (contiguous)."""
        return torch.ops.mkldnn._reorder_linear_weight(w, ROW_TILE)

    def run(self, x: torch.Tensor, prepared: object, b: torch.Tensor | None) -> torch.Tensor:
        """x [M, k] times the prepared weight, plus b [out]: [M, out] in x's dtype."""
        return torch.ops.mkldnn._linear_pointwise(x, prepared, b, "none", [], "")


TORCH_ONEDNN = OneDnnGemm()
_onednn = TORCH_ONEDNN


def use_onednn(route: OneDnnGemm) -> None:
    """Run this process's oneDNN GEMMs through `route` from now on (weights prepared for the
    previous route are prepared again). Its caller vouches that `route` gives TORCH_ONEDNN's
    bits on the model's shapes (`parity.vllm_plugin.onednn` compares them first)."""
    global _onednn
    _onednn = route
    _PREPARED.clear()


def onednn() -> OneDnnGemm:
    """The route this process's oneDNN GEMMs take."""
    return _onednn


# first weight of a stack -> (identity, version and storage of each weight and bias and the
# dtype when prepared, the prepared stacked weight, the stacked bias, output columns)
_PREPARED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _prepared(ws: Sequence[torch.Tensor], bs: Sequence[torch.Tensor | None], dtype: torch.dtype
              ) -> tuple[object, torch.Tensor | None, int]:
    """The weights rounded to `dtype` (`_operand`), stacked by output and, for fp32 operands
    on oneDNN, reordered for ROW_TILE-row inputs, and their biases stacked likewise (zeros
    where a weight has none; None if none has one); made again after any of them changes in
    place. Seen: changes that bump a tensor's version counter (copy_ and other in-place ops,
    load_state_dict, torch.optim's default and foreach steps) or swap its storage. Not seen:
    in-place writes through `.data` and `torch.optim.AdamW(fused=True)`, which leave the
    counter alone. Cached because a decode step makes hundreds of these calls: stacking
    the biases again each time cost more than a third of an 8-row QKV GEMM."""
    key = (dtype, *(None if t is None else (id(t), t._version, t.data_ptr()) for t in (*ws, *bs)))
    hit = _PREPARED.get(ws[0])
    if hit is None or hit[0] != key:
        with torch.no_grad():
            w = torch.cat([_operand(w, dtype) for w in ws]) if len(ws) > 1 else _operand(ws[0], dtype)
            columns = w.shape[0]
            if _on_onednn(dtype):  # fp32 operands, and bf16 ones where the GEMM streams bf16
                w = _onednn.prepare(w.contiguous())
            hit = key, w, _stacked_bias(ws, bs, dtype), columns
        _PREPARED[ws[0]] = hit
    return hit[1], hit[2], hit[3]


def forget(weights: Iterable[torch.Tensor]) -> None:
    """Drop the prepared copies made from `weights` (a sharded learner's gathered weights,
    whose storage it frees and refills with new versions: their prepared copies would only
    hold memory until the next gather replaced them)."""
    for w in weights:
        _PREPARED.pop(w, None)


def _stacked_bias(ws: Sequence[torch.Tensor], bs: Sequence[torch.Tensor | None], dtype: torch.dtype
                  ) -> torch.Tensor | None:
    if all(b is None for b in bs):
        return None
    return torch.cat([w.new_zeros(w.shape[0], dtype=_operand_dtype(dtype)) if b is None else _operand(b, dtype)
                      for w, b in zip(ws, bs, strict=True)])


def _forward(flat: torch.Tensor, ws: Sequence[torch.Tensor], bs: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """flat [M, k] (M a multiple of ROW_TILE) times the stacked weights, plus their biases,
    computed in fp32 on flat's values and the weights rounded to flat's dtype; the result is
    rounded to flat's dtype."""
    dtype = flat.dtype
    w, b, columns = _prepared(ws, bs, dtype)
    if _native(dtype):  # calls of BF16_ROWS rows (the last ROW_TILE..BF16_ROWS): one kernel
        parts = [gemm(columns, _onednn.run, flat[i:i + BF16_ROWS], w, b)
                 for i in range(0, flat.shape[0], BF16_ROWS)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)
    acc = accumulation_dtype(dtype)
    # no `.to` where it would not convert: even a no-op call costs microseconds, and a decode
    # step makes hundreds of these calls
    x = flat if acc == dtype else flat.to(acc)
    y = _onednn.run(x, w, b) if _on_onednn(dtype) else gemm(columns, F.linear, x, w, b)
    return y if acc == dtype else y.to(dtype)


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
    if rows != y.shape[0]:
        y = y[:rows]
    outs = (y,) if len(ws) == 1 else y.split_with_sizes([w.shape[0] for w in ws], -1)
    if x.dim() == 2:
        return list(outs)
    return [o.view(*x.shape[:-1], o.shape[-1]) for o in outs]


def linear_aligned(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return linears_aligned(x, [(w, b)])[0]
