"""Aligned GEMMs: one shape class per weight, the same for every caller.

Rows are zero-padded to a multiple of ROW_TILE, so no caller reaches the special paths BLAS
libraries keep for 1-3 row calls (GEMV, small-n kernels: on AMD they differ from the rest even
in MKL's strict CNR mode). A call runs on at most `columns // COLUMNS_PER_THREAD` BLAS threads,
so no thread is handed a sliver of output columns narrower than a vector (MKL computes those on
other paths, measured on AMD at 2-32 threads). That the BLAS keeps one reduction order per row
within this class is proved per machine (`parity.model.selfcheck`); see docs/parity.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from parity.model.blas import set_local_threads

ROW_TILE = 8  # rows of every aligned GEMM operand are a multiple of this
COLUMNS_PER_THREAD = 64  # an aligned GEMM runs on at most out_columns // this BLAS threads


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


def linear_aligned(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    # A multiple of ROW_TILE rows reaches the BLAS whatever the caller's count.
    flat = pad_rows(x.reshape(-1, x.shape[-1])).contiguous()
    y = gemm(w.shape[0], F.linear, flat, w, b)
    return y[: x.numel() // x.shape[-1]].reshape(*x.shape[:-1], w.shape[0])
