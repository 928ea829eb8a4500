"""What this process's BLAS is and how it runs: MKL's version and its CNR mode.

MKL's conditional-numerical-reproducibility (CNR) mode fixes the code branch MKL uses, and in
strict mode (`MKL_CBWR=<branch>,STRICT`) Intel documents one reduction order per output
element whatever the thread count, on Intel processors. `configure()` asks for
`MKL_CBWR=AUTO,STRICT` unless the variable is set already; MKL reads it once, at its first
call, so its owners call it before any GEMM: the `parity` command at start (Ray workers
inherit it), and the aligned-kernel switch (`require_alignment`) for library use. On Intel it
is what keeps GEMMs thread-count invariant.

It is a help, not the guarantee. On AMD (measured on Zen 3 and Zen 4) strict mode still
computes calls of 1-3 rows on other paths, and MKL ignores a pinned branch there. Aligned
kernels therefore pad every GEMM's rows to `ROW_TILE` (`parity.model.gemm`), and
`parity.model.selfcheck` proves row and thread invariance on the machine at hand before
aligned kernels serve. This module only reports what MKL does, for those checks and for the
benchmarks' JSON.
"""

from __future__ import annotations

import ctypes
import functools
import os

DEFAULT_MODE = "AUTO,STRICT"
_STRICT_BIT = 0x10000  # MKL_CBWR_STRICT
_ALL = -1  # MKL_CBWR_ALL: ask for the branch and the strict bit together
_BRANCHES = {
    0: "OFF", 1: "BRANCH_OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
    8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1",
    14: "AVX512_E1",
}


def configure() -> None:
    """Ask MKL for strict CNR in this process and the ones it starts, unless MKL_CBWR says
    otherwise. Only effective before MKL's first call in this process (nothing here can tell
    afterwards without making that call); the proof reports the mode MKL actually runs in."""
    os.environ.setdefault("MKL_CBWR", DEFAULT_MODE)


@functools.cache
def _mkl() -> ctypes.CDLL | None:
    import torch

    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        lib.mkl_serv_cbwr_get.argtypes, lib.mkl_serv_cbwr_get.restype = [ctypes.c_int], ctypes.c_int
        # the C entry point (mkl_set_num_threads_local is the Fortran one, taking a pointer)
        lib.MKL_Set_Num_Threads_Local.argtypes = [ctypes.c_int]
        lib.MKL_Set_Num_Threads_Local.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


def set_local_threads(n: int) -> int:
    """MKL threads for GEMMs this thread calls from now on (0: the global count again);
    returns the previous local setting. A no-op returning 0 when the BLAS is not MKL."""
    lib = _mkl()
    return 0 if lib is None else int(lib.MKL_Set_Num_Threads_Local(n))


def _branch_name(bits: int) -> str:
    name = _BRANCHES.get(bits & 0xFFFF, f"branch {bits & 0xFFFF}")
    return f"{name},STRICT" if bits & _STRICT_BIT else name


def cnr_mode() -> int | None:
    """MKL's CNR mode bits as MKL reports them; None when torch's BLAS is not MKL.

    MKL settles its mode at its first call: ask after a GEMM has run."""
    lib = _mkl()
    return None if lib is None else int(lib.mkl_serv_cbwr_get(_ALL))


def is_strict(mode: int | None) -> bool:
    return mode is not None and bool(mode & _STRICT_BIT)


def describe() -> dict[str, str | None]:
    """The BLAS in a few readable fields (for error messages, reports and caches)."""
    import torch

    lib = _mkl()
    if lib is None:
        return {"blas": "not MKL", "mkl_cbwr": None, "mkl_mode": None, "mkl_auto_branch": None}
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # MKL reports its mode once it has run
    buf = ctypes.create_string_buffer(256)
    lib.MKL_Get_Version_String(buf, len(buf))
    auto = lib.mkl_serv_cbwr_get_auto_branch
    auto.restype = ctypes.c_int
    return {
        "blas": buf.value.decode(errors="replace").strip(),
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
        "mkl_mode": _branch_name(cnr_mode() or 0),
        "mkl_auto_branch": _branch_name(int(auto())),
    }
