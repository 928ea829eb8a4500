"""Freed memory stays in the process: a step's tensors reuse pages instead of faulting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# In a fresh process: where a 16 MiB tensor's memory comes from and whether the heap keeps
# it once freed, as glibc's own statistics (mallinfo2) tell.
_PROBE = """
import ctypes, json, sys
import torch
from parity.core.memory import keep_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
took = keep_freed_memory() if sys.argv[1] == "keep" else None
x = torch.ones(2**22)  # 16 MiB
mapped = libc.mallinfo2().hblkhd  # bytes in blocks mapped apart from the heap
del x
print(json.dumps({"took": took, "mapped_mib": mapped / 2**20,
                  "kept_free_mib": libc.mallinfo2().fordblks / 2**20}))
"""


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True)
    if out.returncode and "mallinfo2" in out.stderr:
        pytest.skip("this C library has no mallinfo2 (glibc >= 2.33)")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_freed_tensors_stay_in_the_heap():
    kept, default = _probe("keep"), _probe("default")
    assert kept["took"] is True
    assert kept["mapped_mib"] < 16 <= kept["kept_free_mib"]  # from the heap, and kept there
    # glibc's defaults: a block this large is mapped on its own and unmapped when freed, so
    # the next one faults its pages in again
    assert default["mapped_mib"] >= 16 > default["kept_free_mib"]


# In a fresh process, as the `parity` command starts: how much of a 64 MiB tensor, once
# written, the kernel backs with huge pages.
_HUGE = """
import json, sys
from parity.core.memory import ask_huge_pages
if sys.argv[1] == "ask":
    ask_huge_pages()
import torch
x = torch.ones(2**24)  # 64 MiB
huge = [l for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages")]
print(int(huge[0].split()[1]) // 1024)
"""


def _huge_mib(mode: str, env: dict[str, str]) -> int:
    out = subprocess.run([sys.executable, "-c", _HUGE, mode], capture_output=True, text=True,
                         env=env)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_large_tensors_get_huge_pages_where_the_kernel_gives_them_on_request():
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[madvise]" not in thp.read_text():
        pytest.skip("the kernel gives huge pages on request only in THP mode madvise")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    assert _huge_mib("ask", env) >= 2  # 2 MiB pages (fewer where memory is short of free 2 MiB runs)
    assert _huge_mib("default", env) == 0  # torch's default: 4 KB pages
    assert _huge_mib("ask", env | {"THP_MEM_ALLOC_ENABLE": "0"}) == 0  # the user's setting wins
