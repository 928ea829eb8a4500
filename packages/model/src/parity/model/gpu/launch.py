"""What every Triton kernel of the GPU set shares: how it sees its operands, and whether it
runs under Triton's interpreter.

Under `TRITON_INTERPRET=1` (read by triton when a kernel is decorated, so it must be set before
this package is imported) every kernel runs on CPU tensors with numpy, one program after
another: that proves the kernels' structure (tiles, masks, loop bounds, no batch-dependent
split), never a GPU's bits. The interpreter multiplies bfloat16 dot operands as raw integers
(Triton issue 11584), so there the kernels widen bf16 tiles to fp32 before `tl.dot` (exact:
bf16 values are fp32 values); on a GPU they hand bf16 tiles to the tensor cores.
"""

from __future__ import annotations

import torch

# Compile options of every launch: no FMA contraction, so each multiply and add rounds where
# the kernel's source says, whatever the compiler version would otherwise fuse.
OPTIONS = {"enable_fp_fusion": False}


def interpreted(kernel: object) -> bool:
    """Whether `kernel` (a `@triton.jit` function) runs under Triton's interpreter."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., w] as a [rows, w] matrix whose last dimension has unit stride (a view when it
    can be one); the kernels address row r as `base + r * stride(0)`."""
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(-1) == 1 or flat.shape[-1] == 1 else flat.contiguous()
