"""The fused attention kernel alone (`parity.model.fused.attention`) on a paged pool: a prefill
of new rows against cached keys, and a decode step, timed over rounds (a diagnostic, not a
bench: `parity bench engine` times whole engines side by side).

    uv run python scripts/attention_kernel.py                       # 4 x 992 rows at 8K keys
    uv run python scripts/attention_kernel.py --context 16384 --threads 1

Prints, per case, the fastest and median round in ms and the fastest as GFLOP/s (4·D flops
per visible query-key pair and query head: scores and P·V) or, for decode, as GB/s of keys
and values read. The tiny model's heads (4 query, 2 KV, D = 64) unless told otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from parity.model import fused
from parity.model.layout import SeqLayout


def _case(seqs: int, rows: int, context: int, hq: int, hkv: int, d: int, block: int,
          dtype: torch.dtype):
    """Queries for the last `rows` positions of `seqs` sequences of `context` tokens, their
    keys and values in a pool of `block`-token blocks in shuffled order, and the layout."""
    g = torch.Generator().manual_seed(0)
    per = -(-context // block)
    k = torch.randn(seqs * per, hkv, block, d, generator=g).to(dtype)
    v = torch.randn(seqs * per, hkv, block, d, generator=g).to(dtype)
    table = torch.randperm(seqs * per, generator=g).to(torch.int32).view(seqs, per)
    q = torch.randn(seqs * rows, hq, d, generator=g)
    positions = torch.arange(context - rows, context).repeat(seqs)
    layout = SeqLayout([s * rows for s in range(seqs)], [rows] * seqs, positions, [context] * seqs)
    return q, k, v, layout, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--rows", type=int, default=992, help="new rows a sequence prefills")
    ap.add_argument("--context", type=int, default=8192, help="keys of each sequence, new rows included")
    ap.add_argument("--heads", type=int, nargs=2, default=(4, 2), metavar=("Q", "KV"))
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block", type=int, default=16, help="pool block size (the engine's default)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the pool's keys and values (queries are fp32 either way)")
    a = ap.parse_args()
    if a.head_dim not in fused.HEAD_DIMS:
        ap.error(f"--head-dim {a.head_dim}: the kernel serves multiples of 16 from 16 to 256")
    if not fused.available():
        raise SystemExit(f"the fused kernel is not available here: {fused.describe()}")
    torch.set_num_threads(a.threads)
    hq, hkv = a.heads
    print(f"{fused.describe()}; {a.threads} threads; {a.dtype} keys and values")
    for name, rows, calls in (("prefill", a.rows, 3), ("decode", 1, 200)):
        q, k, v, layout, table = _case(a.seqs, rows, a.context, hq, hkv, a.head_dim, a.block,
                                   getattr(torch, a.dtype))
        fused.attention(q, k, v, layout, a.head_dim ** -0.5, table)  # warm: pages, threads
        times = []
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                fused.attention(q, k, v, layout, a.head_dim ** -0.5, table)
            times.append((time.perf_counter() - t0) / calls)
        best = min(times)
        if rows > 1:
            pairs = a.seqs * (rows * (a.context - rows) + rows * (rows + 1) // 2)
            rate = f"{pairs * hq * 4 * a.head_dim / best / 1e9:.1f} GFLOP/s"
        else:
            rate = f"{2 * k.numel() * k.element_size() / best / 1e9:.1f} GB/s of keys and values"
        print(f"{name}: {a.seqs} x {rows} rows at {a.context} keys: {best * 1e3:.3f} ms "
              f"(median {statistics.median(times) * 1e3:.3f}), {rate}")


if __name__ == "__main__":
    main()
