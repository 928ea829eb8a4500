"""The GPU set's row-wise ops: RMSNorm, SiLU*mul and log-softmax.

Each program reads one row (SiLU*mul: one block of one row) and nothing else, and its block
size and warp count depend on the row width alone, so a row's reduction tree (`tl.sum` over a
fixed block) and its elementwise arithmetic are the same in every call, whatever the row count
or the row's place. All arithmetic is fp32 on the inputs' values, rounded once to the output
dtype. RMSNorm normalises by `sqrt_rn(mean(x^2) + eps)` with IEEE division, as the CPU set
does; log-softmax walks the vocabulary in fixed blocks, in order (max, then the sum of
exponentials accumulated per lane and reduced once, then the output). Backwards are ordinary
torch ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from parity.model.gpu.launch import OPTIONS, rows
from parity.model.rowwise import differentiable_silu_mul

ELEMENTWISE_BLOCK = 1024  # SiLU*mul: columns per program
VOCAB_BLOCK = 4096  # log-softmax: vocabulary entries per step


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, sx, sy, H, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    ok = c < H
    x = tl.load(x_ptr + row * sx + c, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    rms = tl.math.sqrt_rn(tl.math.div_rn(tl.sum(x * x, 0), H * 1.0) + eps)
    tl.store(y_ptr + row * sy + c, (tl.math.div_rn(x, rms) * w).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, sg, su, sy, W, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < W
    g = tl.load(g_ptr + row * sg + c, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * su + c, mask=ok, other=0.0).to(tl.float32)
    y = tl.math.div_rn(g, 1.0 + tl.exp(-g)) * u
    tl.store(y_ptr + row * sy + c, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _log_softmax_kernel(x_ptr, y_ptr, sx, sy, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    x_row, y_row = x_ptr + row * sx, y_ptr + row * sy
    top = tl.full((BLOCK,), float("-inf"), tl.float32)
    for s in range(0, V, BLOCK):
        top = tl.maximum(top, tl.load(x_row + s + c, mask=s + c < V, other=float("-inf")).to(tl.float32))
    m = tl.max(top, 0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for s in range(0, V, BLOCK):
        x = tl.load(x_row + s + c, mask=s + c < V, other=float("-inf")).to(tl.float32)
        acc += tl.exp(x - m)
    lse = tl.log(tl.sum(acc, 0))
    for s in range(0, V, BLOCK):
        x = tl.load(x_row + s + c, mask=s + c < V, other=0.0).to(tl.float32)
        tl.store(y_row + s + c, (x - m) - lse, mask=s + c < V)


def _rms_norm_fwd(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    flat = rows(x)
    y = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
    if flat.shape[0]:
        block = triton.next_power_of_2(flat.shape[1])
        _rms_norm_kernel[(flat.shape[0],)](flat, w.detach().to(x.dtype).contiguous(), y,
                                           flat.stride(0), y.stride(0), flat.shape[1], eps,
                                           BLOCK=block, num_warps=_warps(block), **OPTIONS)
    return y.view(x.shape)


class _RMSNorm(torch.autograd.Function):
    """The kernel's forward; the usual RMSNorm gradient in fp32 for backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return _rms_norm_fwd(x, w, eps)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        x, w = ctx.saved_tensors
        xf, gf, wf = x.float(), grad.float(), w.to(x.dtype).float()
        rms = torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
        xhat = xf / rms
        gw = gf * wf
        gx = (gw - xhat * (gw * xhat).mean(-1, keepdim=True)) / rms
        return gx.to(x.dtype), (gf * xhat).reshape(-1, x.shape[-1]).sum(0).to(w.dtype), None


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., h] / sqrt(mean(x^2) + eps) * w, in fp32 with w rounded to x's dtype; x's dtype."""
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return _RMSNorm.apply(x, w, eps)
    return _rms_norm_fwd(x, w, eps)


def _silu_mul_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g, u = rows(gate), rows(up)
    y = torch.empty(g.shape, dtype=gate.dtype, device=gate.device)
    if g.shape[0]:
        grid = (g.shape[0], triton.cdiv(g.shape[1], ELEMENTWISE_BLOCK))
        _silu_mul_kernel[grid](g, u, y, g.stride(0), u.stride(0), y.stride(0), g.shape[1],
                               BLOCK=ELEMENTWISE_BLOCK, num_warps=4, **OPTIONS)
    return y.view(gate.shape)


# gate / (1 + exp(-gate)) * up, in fp32, rounded to gate's dtype
silu_mul = differentiable_silu_mul(_silu_mul_fwd)


def _log_softmax_fwd(logits: torch.Tensor) -> torch.Tensor:
    flat = rows(logits)
    y = torch.empty(flat.shape, dtype=torch.float32, device=logits.device)
    if flat.shape[0]:
        _log_softmax_kernel[(flat.shape[0],)](flat, y, flat.stride(0), y.stride(0), flat.shape[1],
                                              BLOCK=VOCAB_BLOCK, num_warps=_warps(VOCAB_BLOCK), **OPTIONS)
    return y.view(logits.shape)


class _LogSoftmax(torch.autograd.Function):
    """The kernel's forward; grad - softmax * sum(grad) for backward."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = _log_softmax_fwd(logits)
        ctx.save_for_backward(out)
        ctx.dtype = logits.dtype
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (out,) = ctx.saved_tensors
        return (grad - out.exp() * grad.sum(-1, keepdim=True)).to(ctx.dtype)


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """fp32 log-probabilities over the last dimension of `logits` [..., V]."""
    if torch.is_grad_enabled() and logits.requires_grad:
        return _LogSoftmax.apply(logits)
    return _log_softmax_fwd(logits)
