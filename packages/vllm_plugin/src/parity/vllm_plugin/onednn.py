"""vLLM's per-weight oneDNN handle as the route of parity's oneDNN GEMMs in a vLLM worker.

torch's `mkldnn::_linear_pointwise` looks its oneDNN primitive up and wraps its tensors at
every call; vLLM's `onednn_mm` keeps one handle per weight (the weight packed once, the
primitive cached by row count) and skips that: 13 vs 21 us for an 8-row GEMM of 128 -> 384,
100 vs 116 at the 0.5B model's QKV shape (Sapphire Rapids, 2 threads), and a decode step
makes four such calls per layer. Both reach the same oneDNN matmul, but through two builds
of oneDNN (vLLM's own and torch's), so the route is taken only where it gives torch's bits:
`install` first compares the two on every GEMM shape of the model, in each dtype whose GEMMs
run on oneDNN, at decode, prefill and learner-sized row counts and at 1 and the process's
threads, and keeps torch's route on any difference. The worker's start-up proof and the
fingerprint it shows at /health then run on the route it took.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from parity.model import gemm
from parity.model.config import ModelConfig
from parity.model.selfcheck import linear_dtypes, route_difference

logger = logging.getLogger(__name__)

class VllmHandles(gemm.OneDnnGemm):
    """Each prepared weight is a vLLM `onednn_mm` handle (it holds its own packed copy)."""

    name = "vLLM onednn_mm"

    def __init__(self) -> None:
        from vllm import _custom_ops as ops

        self._ops = ops

    def prepare(self, w: torch.Tensor) -> object:
        return self._ops.create_onednn_mm(w.t(), 128)

    def run(self, x: torch.Tensor, prepared: Any, b: torch.Tensor | None) -> torch.Tensor:
        out = torch.empty(x.shape[0], prepared.n, dtype=x.dtype)
        torch.ops._C.onednn_mm(out, x, b, prepared.handler_tensor)
        return out


def install(cfg: ModelConfig) -> str:
    """Take vLLM's handles for this process's oneDNN GEMMs if they give torch's bits on
    cfg's shapes; returns which route the GEMMs take and why. `PARITY_VLLM_ONEDNN=0` keeps
    torch's route."""
    if os.environ.get("PARITY_VLLM_ONEDNN", "1") == "0":
        return f"{gemm.TORCH_ONEDNN.name} (PARITY_VLLM_ONEDNN=0)"
    if not gemm.ONEDNN or not hasattr(torch.ops._C, "create_onednn_mm_handler"):
        return f"{gemm.TORCH_ONEDNN.name} (this vLLM build has no onednn_mm)"
    route = VllmHandles()
    with torch.no_grad():  # every dtype with GEMMs of its own: what the fingerprint runs
        why = route_difference(route, cfg, linear_dtypes())
    if why is not None:
        logger.warning("parity keeps torch's oneDNN route: %s", why)
        return f"{gemm.TORCH_ONEDNN.name} ({why})"
    gemm.use_onednn(route)
    return f"{route.name} (torch's bits on every GEMM shape of the model)"
