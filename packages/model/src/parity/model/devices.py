"""Kernels by device: the aligned set that serves CPU and CUDA tensors alike, and the proof
that must pass before it serves.

Each aligned op looks at its first tensor's device: CPU tensors take the CPU set
(`parity.model.kernels`), CUDA tensors parity's Triton set (`parity.model.gpu`), imported
only when a CUDA tensor or device first shows up. The proof is the CPU one
(`parity.model.selfcheck`) or, on a CUDA device, the GPU set's (`parity.model.gpu.selfcheck`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TypeVar

import torch

from parity.model import blas, gemm, panels
from parity.model.config import ModelConfig
from parity.model.kernels import ALIGNED_CPU, STANDARD, AlignmentError, KernelMode, Kernels
from parity.model.selfcheck import Verdict, refusal, verify

Op = TypeVar("Op", bound=Callable[..., object])


def _gpu(device: torch.device | str) -> Kernels:
    """The Triton kernel set for a CUDA device, or AlignmentError naming why it cannot serve."""
    from parity.model.gpu.device import kernels_for

    return kernels_for(device)


def _by_device(cpu: Op, name: str) -> Op:
    """`cpu` for CPU tensors; for CUDA tensors (the first argument's device), the Triton set's
    op of the same name."""

    def op(x: torch.Tensor, *args: object) -> object:
        if x.is_cuda:
            return getattr(_gpu(x.device), name)(x, *args)
        return cpu(x, *args)

    return op  # type: ignore[return-value]


ALIGNED = Kernels("aligned", *(_by_device(getattr(ALIGNED_CPU, name), name) for name in
                               ("linear", "linears", "rms_norm", "silu_mul", "attention",
                                "log_softmax")))


def get_kernels(mode: KernelMode | str, device: torch.device | str | None = None) -> Kernels:
    """The kernels of `mode`. Aligned ops serve CPU and CUDA tensors alike; with a CUDA
    `device`, whether the Triton set can serve there is checked first, and aligned mode is
    refused with an AlignmentError naming the cause if it cannot."""
    if mode == "aligned":
        if device is not None and torch.device(device).type == "cuda":
            _gpu(device)
        return ALIGNED
    if mode == "standard":
        return STANDARD
    raise ValueError(f"kernels must be 'aligned' or 'standard', not {mode!r}")


def require_alignment(cfg: ModelConfig, device: torch.device | str | None = None) -> Verdict:
    """The proof for `cfg`'s shapes, or AlignmentError. Called before aligned kernels serve;
    on a CUDA `device`, the GPU kernel set's proof there."""
    if device is not None and torch.device(device).type == "cuda":
        from parity.model.gpu.selfcheck import require_device_alignment

        return require_device_alignment(cfg, torch.device(device))
    blas.configure()  # strict CNR, if MKL has not run yet in this process (parity.model.blas)
    panels.take(cfg)  # fp32 GEMMs on parity's panels where they give oneDNN's bits
    verdict = verify(cfg)
    if not verdict.ok:
        raise AlignmentError(refusal(verdict))
    return verdict


def forget_prepared(weights: Iterable[torch.Tensor]) -> None:
    """Drop the aligned GEMMs' prepared copies of `weights`, on either kernel set (the GPU
    set's only if it was imported: it holds none otherwise)."""
    weights = list(weights)
    gemm.forget(weights)
    gpu = sys.modules.get("parity.model.gpu.gemm")
    if gpu is not None:
        gpu.forget(weights)
