"""The decoder's reducing ops in two modes behind one switch.

`aligned` (the default): every op gives each row the same bits whatever the number of rows
in the call, the row's position among them, and the thread count. How, on CPU:
  * GEMMs hand the BLAS one shape class per weight (q/k/v stacked into one, gate/up into
    one; fp32 on oneDNN, each stacked weight reordered once): the rows of
    every aligned GEMM operand
    (linear inputs, attention query matrices) are zero-padded to a multiple of ROW_TILE, so
    no caller ever reaches the special paths BLAS libraries keep for 1-3 row calls (GEMV,
    small-n kernels) — the paths that made rows differ by batch size on AMD even in MKL's
    strict CNR mode. A linear also runs on at most out_features // COLUMNS_PER_THREAD BLAS
    threads: split finer, MKL hands threads slivers of output columns narrower than a
    vector and computes them on other paths (measured on AMD at 2-32 threads). That the
    BLAS then keeps one reduction order per row for every multiple of ROW_TILE, row offset
    and thread count is proved on this machine, on the model's own shapes, before aligned
    kernels serve (`parity.model.selfcheck`).
  * Attention visits keys in tiles of `KV_TILE` counted from absolute position 0; the
    softmax max is exact in any order, the per-tile sums reduce a fixed-size last
    dimension, and tiles are combined by a pairwise tree that zero tiles cannot change.
    Masked keys contribute exact zeros, so a query sees the same arithmetic whether it is
    row t of a training sequence, a decode step, or any chunked-prefill split, and tiles
    a query cannot see may be skipped (`SeqLayout.groups`).
  * Elementwise transcendental functions avoid kernels whose scalar tail loop differs
    from their vector body (F.silu, sigmoid): silu is x / (1 + exp(-x)), and exp is
    the vectorised library call that treats every element alike.
`standard`: the same math written as anyone would (F.linear with bias, SDPA, F.silu),
used as the contrast the parity audit must catch.

bfloat16 (inputs in bf16): aligned ops compute in fp32 on the bf16 values with the weights
rounded to bf16, by the very fp32 ops above, and round each output to bf16 once — fixed
rounding points, the same in every caller, so learner and engine stay bit-identical. Linears,
on a CPU with AMX, run oneDNN's bf16 GEMM on the bf16 weights instead, in calls
of one kernel's row range (`parity.model.gemm`). Standard
ops run torch's native bf16 kernels, as a bf16 model usually runs (RMSNorm in fp32 inside,
as Hugging Face's does).

Backward passes need only be correct: aligned ops compute their gradients with ordinary
multi-threaded torch ops (attention with torch's flash-attention backward, from the output
and log-normaliser its forward kept).

This module holds the CPU set. On CUDA, aligned ops hand their tensors to parity's Triton
kernel set (`parity.model.gpu`, docs/gpu.md), invariant by construction;
`parity.model.devices` joins the two (each op looks at its first tensor's device, so CPU
tensors keep the CPU path above, bit for bit) and refuses aligned mode with an
`AlignmentError` naming the cause where the GPU set cannot serve; standard ops run anywhere
torch does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from parity.model.attention import attention_aligned, attention_standard
from parity.model.gemm import Part, accumulation_dtype, linear_aligned, linears_aligned
from parity.model.rowwise import (
    rms_norm_aligned,
    rms_norm_bf16,
    rms_norm_standard,
    silu_mul_aligned,
    silu_mul_bf16,
    silu_mul_standard,
)

KernelMode = Literal["aligned", "standard"]


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    # A per-row reduction over a fixed-size last dimension: row-invariant as it is on CPU.
    return torch.log_softmax(logits.float(), dim=-1)


@dataclass(frozen=True)
class Kernels:
    """One implementation of each reducing op. Signatures:

    linear(x [..., k], w [out, k], b [out] | None) -> [..., out]
    linears(x [..., k], [(w, b), ...]) -> [linear(x, w, b), ...] (aligned: one stacked GEMM)
    rms_norm(x [..., h], w [h], eps) -> [..., h]
    silu_mul(gate, up) -> silu(gate) * up
    attention(q [N, Hq, D], k [S, Hkv, L, D], v [S, Hkv, L, D], layout, scale) -> [N, Hq, D]
        (k/v hold each sequence's keys from absolute position 0; L is a multiple of KV_TILE)
    log_softmax(logits [..., V]) -> fp32 log-probabilities over the last dim
    """

    mode: KernelMode
    linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    linears: Callable[[torch.Tensor, Sequence[Part]], list[torch.Tensor]]
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    silu_mul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    attention: Callable[..., torch.Tensor]
    log_softmax: Callable[[torch.Tensor], torch.Tensor] = _log_softmax


def in_fp32(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """fn as an aligned op for bf16 inputs too: its tensor arguments rounded to the first
    one's dtype and computed in fp32, the output rounded back to bf16 (other dtypes: fn)."""

    def op(x: torch.Tensor, *args: object) -> torch.Tensor:
        dtype = x.dtype
        if accumulation_dtype(dtype) == dtype:
            return fn(x, *args)
        up = [a.to(dtype).float() if isinstance(a, torch.Tensor) else a for a in args]
        return fn(x.float(), *up).to(dtype)

    return op


def _bf16_first(bf16: Callable[..., torch.Tensor | None], fn: Callable[..., torch.Tensor]
                ) -> Callable[..., torch.Tensor]:
    """`in_fp32(fn)`, with bf16 inputs taken by `bf16` first where it serves (the C row-wise
    ops on bf16 values: the same bits without torch's conversions around the fp32 call)."""
    wide = in_fp32(fn)

    def op(x: torch.Tensor, *args: object) -> torch.Tensor:
        if x.dtype == torch.bfloat16:
            y = bf16(x, *args)
            if y is not None:
                return y
        return wide(x, *args)

    return op


def _linear_standard(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, w.to(x.dtype), None if b is None else b.to(x.dtype))


def _linears_standard(x: torch.Tensor, parts: Sequence[Part]) -> list[torch.Tensor]:
    return [_linear_standard(x, w, b) for w, b in parts]


class AlignmentError(RuntimeError):
    """Aligned kernels cannot serve here (not row-invariant on this machine, or no GPU kernel
    set for this device); aligned mode is refused."""


# The CPU set; `parity.model.devices.ALIGNED` adds CUDA tensors (the Triton set) to it.
ALIGNED_CPU = Kernels("aligned", linear_aligned, linears_aligned,
                      _bf16_first(rms_norm_bf16, rms_norm_aligned),
                      _bf16_first(silu_mul_bf16, silu_mul_aligned), in_fp32(attention_aligned))
STANDARD = Kernels("standard", _linear_standard, _linears_standard, rms_norm_standard,
                   silu_mul_standard, attention_standard)
