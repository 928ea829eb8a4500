"""RMSNorm and SiLU*mul, aligned and standard.

Aligned forwards give each row the same bits in any call: RMSNorm adds, then normalises by
`sqrt(mean(x^2) + eps)` (sqrt and division are correctly rounded in every code path; rsqrt
need not be), reducing a fixed-size last dimension; SiLU is `x / (1 + exp(-x))` with the
vectorised library exp, which treats every element alike (F.silu's scalar tail loop does not).
Their backwards are the ordinary gradients, in a few fused passes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def _rms_norm_fwd(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    # sqrt and division are correctly rounded in every code path; rsqrt need not be.
    rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x / rms * w, rms


class _RMSNorm(torch.autograd.Function):
    """Aligned forward; the usual RMSNorm gradient, in a few fused passes, for backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        y, rms = _rms_norm_fwd(x, w, eps)
        ctx.save_for_backward(x, w, rms)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        x, w, rms = ctx.saved_tensors
        xhat = x / rms
        gw = grad * w
        gx = (gw - xhat * (gw * xhat).mean(-1, keepdim=True)) / rms
        return gx, (grad * xhat).reshape(-1, x.shape[-1]).sum(0), None


def rms_norm_aligned(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return _RMSNorm.apply(x, w, eps)
    return _rms_norm_fwd(x, w, eps)[0]


def rms_norm_standard(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """As Hugging Face's: normalised in at least fp32, scaled in x's dtype."""
    xw = x.to(torch.promote_types(x.dtype, torch.float32))
    return w.to(x.dtype) * (xw * torch.rsqrt(xw.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _silu_mul_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    d = torch.neg(gate).exp_().add_(1)  # one buffer, updated in place: 1 + e^-gate
    return torch.div(gate, d, out=d).mul_(up)


def differentiable_silu_mul(forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                            ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """silu(gate) * up computed by `forward` (an aligned forward: CPU here, Triton on CUDA),
    with the ordinary derivative, in at least fp32, for backward."""

    class SiluMul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            ctx.save_for_backward(gate, up)
            return forward(gate, up)

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
            gate, up = ctx.saved_tensors
            wide = torch.promote_types(gate.dtype, torch.float32)  # bf16 in, fp32 math
            g, u, gf = gate.to(wide), up.to(wide), grad.to(wide)
            return (torch.ops.aten.silu_backward(gf * u, g).to(gate.dtype),
                    (gf * F.silu(g)).to(up.dtype))

    def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
            return SiluMul.apply(gate, up)
        return forward(gate, up)

    return silu_mul


silu_mul_aligned = differentiable_silu_mul(_silu_mul_fwd)


def silu_mul_standard(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up
