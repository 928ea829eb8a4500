"""Freed memory stays in the process: a step's tensors reuse pages instead of faulting."""

from __future__ import annotations

import json
import subprocess
import sys

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
