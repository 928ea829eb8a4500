"""Whether the GPU kernel set can serve on a CUDA device, and the one line that says why not.

Aligned mode on CUDA needs a CUDA (not ROCm) device of compute capability 8.0 or newer (bf16
tensor-core dots with fp32 accumulation) and a Triton that compiles and runs every kernel of
the set there, in fp32 and bf16. Each is tried once per device, on tiny inputs; a failure
refuses aligned mode with an `AlignmentError` naming the cause, and `standard` still works.
"""

from __future__ import annotations

import functools

import torch

from parity.model.kernels import AlignmentError, Kernels

MIN_CAPABILITY = (8, 0)


def _index(device: torch.device) -> int:
    return torch.cuda.current_device() if device.index is None else device.index


def _exercise(kernels: Kernels, device: torch.device) -> None:
    """Compile and run each kernel once per dtype on tiny inputs (a decode step and a
    prefill piece of attention)."""
    from parity.model.layout import SeqLayout

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        def t(*shape: int, dtype: torch.dtype = dtype) -> torch.Tensor:
            return torch.randn(*shape, generator=g).to(device, dtype)

        x, w, b = t(3, 64), t(96, 64), t(96)
        kernels.linears(x, [(w, b), (w, None)])
        kernels.rms_norm(x, t(64), 1e-6)
        kernels.silu_mul(x, x)
        kernels.log_softmax(t(3, 300, dtype=torch.float32))
        layout = SeqLayout.from_lengths([1, 2], [4, 0])
        kernels.attention(t(3, 4, 16), t(2, 2, 64, 16), t(2, 2, 64, 16), layout, 0.25)
    torch.cuda.synchronize(device)


@functools.cache
def _unavailable(index: int) -> str | None:
    if torch.version.hip:
        return "ROCm devices are not supported by parity's GPU kernels (CUDA only)"
    name = torch.cuda.get_device_name(index)
    cap = torch.cuda.get_device_capability(index)
    if cap < MIN_CAPABILITY:
        return (f"{name} has compute capability {cap[0]}.{cap[1]}; parity's GPU kernels need "
                f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer")
    try:
        import triton
    except ImportError as e:
        return f"Triton is not importable: {e}"
    try:
        from parity.model.gpu import KERNELS

        _exercise(KERNELS, torch.device("cuda", index))
    except Exception as e:  # any failure to compile or run refuses aligned mode
        first = (str(e).strip().splitlines() or [""])[0]
        return (f"Triton {triton.__version__} cannot compile or run parity's GPU kernels on "
                f"{name}: {type(e).__name__}: {first}")
    return None


def unavailable(device: torch.device | str) -> str | None:
    """Why aligned kernels cannot serve on `device` (a CUDA device), or None if they can."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"no CUDA device is available to torch {torch.__version__} for {device}"
    return _unavailable(_index(device))


def kernels_for(device: torch.device | str) -> Kernels:
    """The GPU kernel set, or AlignmentError with the one line that says why it cannot serve."""
    why = unavailable(device)
    if why is not None:
        raise AlignmentError(f"aligned kernels refused on {device}: {why}; use kernels='standard'")
    from parity.model.gpu import KERNELS

    return KERNELS
