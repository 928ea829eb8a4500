"""A deliberately batch-dependent GEMM: the negative control the GPU checks must catch.

It is what a library tuned for speed does: calls with few rows split K into parts (more
programs for a small output), computed separately and summed, and calls with many rows walk
K in one pass. Both are correct to rounding; a row's bits then depend on how many rows share
its call. The invariance checks must find this variant differ, which shows they can see a
difference at all.
"""

from __future__ import annotations

from itertools import pairwise

import torch

from parity.model.gpu.gemm import gemm

SPLIT_BELOW = 16  # calls with fewer rows split K
SPLITS = 4


def split_k_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w [N, K].T in fp32, K split in SPLITS parts when M < SPLIT_BELOW."""
    if x.shape[0] >= SPLIT_BELOW:
        return gemm(x, w, out_dtype=torch.float32)
    bounds = torch.linspace(0, x.shape[1], SPLITS + 1).long().tolist()
    parts = [gemm(x[:, a:b], w[:, a:b], out_dtype=torch.float32)
             for a, b in pairwise(bounds)]
    return torch.stack(parts).sum(0)
