"""The memory-bandwidth bound on decode: every step streams the model's weights once.

A decode step of a batch computes one token per sequence and reads every weight matrix once
(rows of the embedding only, unless it is tied to the output head), so
tokens/s <= batch x bandwidth / weight bytes. KV reads come on top (they dominate at long
context), so the bound is loose there.
"""

from __future__ import annotations

import time

import torch

from parity.model import Decoder

COPY_BYTES = 2**29  # 512 MiB: far beyond any last-level cache


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = 5) -> float:
    """Bytes/s of a large fp32 copy in this process (read + write, as STREAM counts a copy),
    best of `repeats`, on torch's current thread count."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch of dst's pages
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best


def streamed_weight_bytes(model: Decoder) -> int:
    """Bytes of the parameters one decode step reads in full: all but an untied embedding."""
    embed = model.model.embed_tokens.weight
    tied = model.config.tie_word_embeddings
    return sum(p.numel() * p.element_size() for p in model.parameters() if tied or p is not embed)


def tokens_per_s_limit(batch: int, bandwidth: float, weight_bytes: int) -> float:
    """The decode bound: batch x bandwidth / weight bytes."""
    return batch * bandwidth / weight_bytes
