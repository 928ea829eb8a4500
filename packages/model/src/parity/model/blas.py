"""MKL's strict CNR mode: what makes every fp32 GEMM row- and thread-invariant on CPU.

By default MKL picks a GEMM kernel by shape and thread count, so a row's bits depend on how
many rows share the call (measured: 638 of 1,812 probed row counts, shapes and thread counts
differed). In strict conditional-numerical-reproducibility mode (`MKL_CBWR=<branch>,STRICT`)
MKL keeps one reduction order per output element whatever the row count, row offset and
thread count (0 of the same 1,812 differ), at no measurable cost (`docs/parity.md`).

MKL reads the mode once, at its first call. `parity.model` sets `MKL_CBWR=AUTO,STRICT` on
import unless the variable is set already; Ray workers inherit it. AUTO picks the code
branch of the CPU at hand, so learner and rollout workers on different CPU generations must
all pin one branch instead (for example `MKL_CBWR=AVX2,STRICT`).
"""

from __future__ import annotations

import ctypes
import functools
import os

DEFAULT_MODE = "AUTO,STRICT"
_STRICT_BIT = 0x10000  # MKL_CBWR_STRICT
_ALL = -1  # MKL_CBWR_ALL: ask for the branch and the strict bit together


@functools.cache
def cnr_mode() -> int | None:
    """MKL's CNR mode bits as MKL reports them; None when torch's BLAS is not MKL."""
    import torch  # after parity.model has set MKL_CBWR

    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        get = lib.mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
    return int(get(_ALL))


@functools.cache
def require_strict_cnr() -> None:
    """Raise unless MKL runs in strict CNR mode (checked once per process)."""
    mode = cnr_mode()
    if mode is None:
        raise RuntimeError(
            "aligned kernels need torch's MKL BLAS in strict CNR mode, and this torch build "
            "has no MKL; use kernels='standard'"
        )
    if not mode & _STRICT_BIT:
        raise RuntimeError(
            f"aligned kernels need MKL's strict CNR mode, but MKL runs in mode {mode:#x} "
            f"(MKL_CBWR={os.environ.get('MKL_CBWR', '<unset>')!r}): MKL reads MKL_CBWR at its "
            f"first call, so import parity.model before torch's first matrix product, or set "
            f"MKL_CBWR={DEFAULT_MODE} in the environment"
        )
