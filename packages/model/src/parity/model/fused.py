"""The fused aligned attention kernel (`csrc/attention.c`): built on this machine, called here.

Why C built at first use, and not Numba or torch ops: aligned attention needs one arithmetic
order per query row (scores, online softmax and P*V over key tiles from position 0) at GEMM
speed. Numba reached 22 GFLOP/s here on it (its loops keep the score accumulators in memory,
and a reduction it may not reorder does not vectorise); the C kernel, GCC vector extensions
with four query vectors sharing each key load, reaches 100+ GFLOP/s on 2 cores and never
materialises scores. It needs a C compiler (`parity.model.native` builds it once per machine
into the cache). Where no compiler works, `available()` is False
and attention falls back to the GEMM-tile path (`parity.model.attention`), which the start-up
proof covers the same way; two processes of one job compare the bits they compute
(`selfcheck.fingerprint`), so a worker on a machine without a compiler is refused, never
silently different. `PARITY_FUSED_ATTENTION=0` selects the fallback.

Threads: the call's units (sequence, KV head, up to UNIT_ROWS query rows) are split into
contiguous runs of about equal work, one per torch thread, run on OpenMP's threads (torch's
own pool, see `parity.model.native`). A row's bits do not depend on the split.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from parity.model import native
from parity.model.layout import KV_TILE, SeqLayout

SOURCE = native.CSRC / "attention.c"
UNIT_ROWS = 64  # query rows per unit: their state (max, sum, output row per head) stays in cache
HEAD_DIMS = range(16, 257, 16)  # the head dims the kernel serves


@functools.cache
def _build() -> tuple[ctypes.CDLL | None, str]:
    """The loaded kernel library and its identity, or (None, why not)."""
    if os.environ.get("PARITY_FUSED_ATTENTION", "1") == "0":
        return None, "disabled by PARITY_FUSED_ATTENTION=0"
    dll, what = native.build(SOURCE)
    if dll is None:
        return None, what
    fn = dll.parity_attend
    p, i = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, ctypes.c_int, i, i, i, p, i, i, p, p, i, i, i, i, ctypes.c_float,
                   p, p]
    fn.restype = ctypes.c_int
    return dll, what


def available() -> bool:
    return _build()[0] is not None


def serves(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `attention` takes these operands (fp32 queries; fp32 or bf16 keys and values
    with the same strides, D contiguous; a head dim in HEAD_DIMS) and the kernel is built."""
    return (q.dtype == torch.float32 and q.shape[-1] in HEAD_DIMS and k.stride(-1) == 1
            and k.dtype in (torch.float32, torch.bfloat16) and v.dtype == k.dtype
            and v.stride() == k.stride() and not q.is_cuda and available())


def describe() -> str:
    """What serves aligned attention in this process: the kernel library, or why not."""
    dll, what = _build()
    return f"fused: {what}" if dll is not None else f"GEMM tiles ({what})"


def units(layout: SeqLayout, kv_heads: int, threads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The call's work units [U, 5] (sequence, KV head, first row, rows, first row's position)
    and the cuts [threads + 1] that give each thread a contiguous run of about equal work
    (row-key pairs): computed once per layout, for all its layers."""
    cache = layout.__dict__.setdefault("_fused_units", {})
    if (kv_heads, threads) not in cache:
        rows = []
        for s, (start, n, kv) in enumerate(
                zip(layout.starts, layout.lengths, layout.kv_lens, strict=True)):
            first = kv - n
            for h in range(kv_heads):
                rows += [(s, h, start + a, min(UNIT_ROWS, n - a), first + a)
                         for a in range(0, n, UNIT_ROWS)]
        work = torch.tensor(rows, dtype=torch.int64).reshape(-1, 5)
        cost = (work[:, 3] * (work[:, 4] + work[:, 3] + KV_TILE)).cumsum(0)
        total = int(cost[-1]) if len(work) else 0
        inner = torch.searchsorted(cost, torch.arange(1, threads) * total // threads)
        cuts = torch.cat([torch.zeros(1, dtype=torch.int64), inner,
                          torch.tensor([len(work)])]).to(torch.int64)
        cache[kv_heads, threads] = (work, cuts)
    return cache[kv_heads, threads]


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout, scale: float,
    table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Aligned attention: output [N, Hq, D] fp32 and log-normaliser [N, Hq].

    q [N, Hq, D] fp32. k, v: each sequence's keys from position 0, either dense [S, Hkv, L, D]
    (table None), or a paged pool [blocks, Hkv, block_size, D] read in place through
    `table` [S, max_blocks] (each sequence's blocks). fp32 or bf16 (read as the fp32 values
    they are), D contiguous; other strides are free.
    """
    dll, why = _build()
    if dll is None:
        raise RuntimeError(f"the fused attention kernel is not available: {why}")
    n, hq, d = q.shape
    hkv = k.shape[1]
    if not serves(q, k, v):
        raise ValueError(f"fused attention: unsupported queries {q.dtype} {tuple(q.shape)}, keys "
                         f"{k.dtype} strides {k.stride()}, values {v.dtype} {v.stride()}")
    block_size = k.shape[2]
    if table is None:
        table = torch.arange(k.shape[0], dtype=torch.int32)[:, None]
    q = q.contiguous()
    table = table.to(torch.int32).contiguous()
    out = torch.empty(n, hq, d)
    lse = torch.empty(n, hq)
    threads = max(1, min(torch.get_num_threads(), len(layout.lengths) * hkv))
    work, cuts = units(layout, hkv, threads)
    code = dll.parity_attend(q.data_ptr(), k.data_ptr(), v.data_ptr(),
                             int(k.dtype == torch.bfloat16), k.stride(0), k.stride(1),
                             k.stride(2), table.data_ptr(), table.stride(0), block_size,
                             work.data_ptr(), cuts.data_ptr(), threads, hq, hkv, d, scale,
                             out.data_ptr(), lse.data_ptr())
    if code:
        raise MemoryError("fused attention: out of memory for its tile buffers")
    return out, lse
