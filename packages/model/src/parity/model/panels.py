"""parity's own fp32 GEMM with oneDNN's bits, as the route of aligned fp32 GEMMs.

oneDNN's fp32 matmul reads its blocked weight at 19-21 GB/s in an 8-row decode GEMM on this
2-core Sapphire Rapids, where a plain read streams at 29-33: a decode step spends most of its
time there. Its arithmetic, though, is simple: each output is one row's FMAs in k's order
within blocks of K (512 values at K = 896, 1,024 at 4,864), the blocks' sums added in order,
then the bias. `csrc/gemm.c` keeps that order over weights held in column panels it streams
with a prefetch (24-26 GB/s on the same shapes; at 1,024 rows 0.9-1.5x oneDNN's speed), so it
gives oneDNN's bits where it uses oneDNN's K block.

oneDNN's K block is a heuristic of its own, so it is found, not assumed: `PanelGemm.prepare`
runs each weight's shape through oneDNN and the panels at each candidate block and keeps the
first whose bits are equal (that weight stays on oneDNN if none is); `take` then compares the
two routes on every GEMM shape of a model at decode, prefill and learner-sized row counts
and at 1 and the process's threads (`selfcheck.route_difference`), and takes the panels only
if nothing differs. The start-up proof and the fingerprint nodes compare run on the route
taken. bf16 operands (oneDNN's AMX kernel, whose internal rounding is its own) stay on the
route the panels wrap. `PARITY_GEMM_PANELS=0` keeps oneDNN for fp32 too.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from dataclasses import dataclass

import torch

from parity.model import gemm, native
from parity.model.config import ModelConfig

logger = logging.getLogger(__name__)

SOURCE = native.CSRC / "gemm.c"
PANEL, ROWS = 32, 8  # as csrc/gemm.c
K_BLOCKS = (512, 1024, 256, 2048, 128, 384, 768, 64)  # candidates, most likely first
_ONE_THREAD = 1 << 18  # multiply-adds below which a call runs on one thread


@functools.cache
def c_library() -> ctypes.CDLL | None:
    """`csrc/gemm.c` built and loaded, or None (no C compiler)."""
    dll, _ = native.build(SOURCE)
    if dll is None:
        return None
    p, i = ctypes.c_void_p, ctypes.c_int64
    dll.parity_gemm_panels.argtypes = [p, i, i, i, p]
    dll.parity_gemm_panels_bf16.argtypes = [p, i, i, i, p]
    dll.parity_gemm_bf16_valued.argtypes = [p, i, i, i]
    dll.parity_gemm_bf16_valued.restype = i
    dll.parity_gemm.argtypes = [p, i, i, p, i, i, p, p, i, i]
    return dll


@dataclass(frozen=True)
class Panels:
    """A weight [n, k] as csrc/gemm.c reads it, and oneDNN's K block for its shape."""

    data: torch.Tensor  # [ceil(n / PANEL), k, PANEL], fp32 or bf16 (values that are bf16)
    n: int
    k: int
    kb: int


def pack(w: torch.Tensor, kb: int) -> Panels:
    """w [n, k] (fp32, contiguous) in column panels: held in bf16 if every value is a bf16
    value (a bf16 model's weights as its fp32 GEMMs read them; the kernel widens them, exactly,
    so the bits are those of the fp32 panels with half the bytes streamed)."""
    n, k = w.shape
    half = bool(c_library().parity_gemm_bf16_valued(w.data_ptr(), w.stride(0), n, k))
    data = torch.empty(-(-n // PANEL), k, PANEL, dtype=torch.bfloat16 if half else torch.float32)
    fill = c_library().parity_gemm_panels_bf16 if half else c_library().parity_gemm_panels
    fill(w.data_ptr(), w.stride(0), n, k, data.data_ptr())
    return Panels(data, n, k, kb)


def multiply(x: torch.Tensor, w: Panels, b: torch.Tensor | None) -> torch.Tensor:
    """x [m, k] (fp32, m a multiple of ROWS) times the panels' weight, plus b [n]."""
    x = x.contiguous()
    m = x.shape[0]
    y = torch.empty(m, w.n)
    threads = 1 if m * w.n * w.k < _ONE_THREAD else min(torch.get_num_threads(), w.data.shape[0])
    c_library().parity_gemm(x.data_ptr(), m, w.k, w.data.data_ptr(),
                            int(w.data.dtype == torch.bfloat16), w.n,
                            None if b is None else b.contiguous().data_ptr(), y.data_ptr(),
                            w.kb, threads)
    return y


class PanelGemm(gemm.OneDnnGemm):
    """fp32 weights in panels (where a K block gives oneDNN's bits on their shape); others
    (bf16 operands, a shape no block matches) prepared and run by `fallback`."""

    def __init__(self, fallback: gemm.OneDnnGemm) -> None:
        self.fallback = fallback
        self.name = f"parity C panels (fp32), {fallback.name}"

    def prepare(self, w: torch.Tensor) -> object:
        if w.dtype == torch.float32:
            kb = k_block(self.fallback, *w.shape)
            if kb is not None:
                return pack(w, kb)
        return self.fallback.prepare(w)

    def run(self, x: torch.Tensor, prepared: object, b: torch.Tensor | None) -> torch.Tensor:
        if not isinstance(prepared, Panels):
            return self.fallback.run(x, prepared, b)
        rows = x.shape[0]
        pad = -rows % ROWS  # aligned GEMMs come padded; other callers get zero rows added
        if not pad:
            return multiply(x, prepared, b)
        return multiply(torch.cat([x, x.new_zeros(pad, x.shape[1])]), prepared, b)[:rows]


@functools.cache
def _k_block(fallback: gemm.OneDnnGemm, n: int, k: int) -> int | None:
    g = torch.Generator().manual_seed(n * 7 + k)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(ROWS, k, generator=g)
    want = fallback.run(x, fallback.prepare(w), None)
    for kb in (k, *(c for c in K_BLOCKS if c < k)):
        if torch.equal(multiply(x, pack(w, kb), None), want):
            return kb
    logger.info("fp32 GEMM %d -> %d stays on %s: no K block gives its bits", k, n, fallback.name)
    return None


def k_block(fallback: gemm.OneDnnGemm, n: int, k: int) -> int | None:
    """oneDNN's K block for an [n, k] weight through `fallback`, found by comparing bits at
    ROWS rows (any block of k or more is the whole of k); None if no candidate gives them."""
    with torch.no_grad():
        return _k_block(fallback, n, k)


def take(cfg: ModelConfig) -> str:
    """Run this process's fp32 oneDNN GEMMs on panels if they give oneDNN's bits on cfg's
    shapes (the route the process has, wrapped); returns which route its GEMMs take and why."""
    route = gemm.onednn()
    if isinstance(route, PanelGemm):
        return route.name
    if os.environ.get("PARITY_GEMM_PANELS", "1") == "0":
        return f"{route.name} (PARITY_GEMM_PANELS=0)"
    if not gemm.ONEDNN or c_library() is None:
        return f"{route.name} ({'no oneDNN' if not gemm.ONEDNN else native.build(SOURCE)[1]})"
    panels = PanelGemm(route)
    why = _difference(panels, cfg)
    if why is not None:
        logger.warning("parity keeps %s for fp32 GEMMs: %s", route.name, why)
        return f"{route.name} ({why})"
    gemm.use_onednn(panels)
    return f"{panels.name} (oneDNN's bits on every GEMM shape of the model)"


_COMPARED: dict[tuple, str | None] = {}


def _difference(panels: PanelGemm, cfg: ModelConfig) -> str | None:
    from parity.model.selfcheck import Shapes, route_difference

    key = (id(panels.fallback), Shapes.of(cfg), torch.get_num_threads())
    if key not in _COMPARED:
        with torch.no_grad():
            _COMPARED[key] = route_difference(panels, cfg, (torch.float32,))
    return _COMPARED[key]
