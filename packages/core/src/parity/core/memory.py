"""Keeping freed memory in the process instead of handing it back to the kernel.

A forward call allocates and frees tensors of hundreds of KB to tens of MB (score matrices,
gathered keys, logits), every step. glibc's malloc maps blocks that large afresh and returns
them, or trims the top of its heap, when they are freed, so the next step touches new pages
again: a page fault per 4 KB, which under a hypervisor costs microseconds each. Measured on an
AMD EPYC VM (docs/benchmarks-engine.md): one decode step of the embedded model's attention
took 0.70 ms with glibc's defaults and 0.50 ms with freed memory kept; a decode step of the
0.5B shape faulted up to 7,000 pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 2**30  # freed memory at the top of the heap kept up to this much
MMAP_THRESHOLD = 2**25  # blocks below this come from the heap (32 MiB: glibc's maximum)


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc to serve blocks under MMAP_THRESHOLD from its heap and to keep up to
    TRIM_THRESHOLD of freed heap mapped, in this process (threads included; not in processes
    it starts). True if glibc took both settings; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def ask_huge_pages() -> None:
    """Ask torch to back each tensor of 2 MiB or more with transparent huge pages (2 MiB
    aligned and madvise'd: torch's THP_MEM_ALLOC_ENABLE), in this process and those it starts
    (Ray workers, vLLM servers), unless the variable is set already. Weights stream through
    the TLB at every decode step: with 4 KB pages a 0.5B fp32 step walks the page tables
    for about 500,000 pages, and on a Sapphire Rapids VM whose kernel leaves huge pages to
    madvise, 8-row GEMMs over all of its weights ran 7% faster (docs/benchmarks.md). Where
    the kernel never gives huge pages it changes only alignment. torch reads the variable
    once, at its first allocation, so the `parity` command sets it before any tensor; the
    nodes of a cluster started apart (`ray start`) need it in their own environment."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
