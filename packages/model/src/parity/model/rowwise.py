"""RMSNorm and SiLU*mul, aligned and standard.

Aligned forwards give each row the same bits in any call: RMSNorm normalises by
`sqrt(mean(x^2) + eps)` (sqrt and division are correctly rounded in every code path; rsqrt
need not be), reducing a fixed-size last dimension; SiLU is `x / (1 + exp(-x))` with the
vectorised library exp, which treats every element alike (F.silu's scalar tail loop does not).
Their backwards are the ordinary gradients, in a few fused passes.

In fp32 on a CPU with a C compiler, RMSNorm (widths a multiple of 16), SiLU*mul and RoPE
(`parity.model.rope`) run as one C call each (`csrc/rowwise.c`, built by `parity.model.native`):
the same math in one pass, where torch's five to seven ops per call cost a decode step about
70 us each in dispatch alone. In bf16 without gradients (`rms_norm_bf16`, `silu_mul_bf16`, the
engine's RoPE and paged store) one C call each too, which widens its operands, runs the fp32
op's own row function and rounds its output to bf16 once: the bits torch's conversions
around the fp32 call give, without their four to six conversion calls per op. Their sums and
exp are their own, so their bits are not torch's: the choice depends on the machine, dtype
and shape class only, never on the call, so every caller on a machine takes the same path,
and the fingerprint nodes compare covers it.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from parity.model import native

SOURCE = native.CSRC / "rowwise.c"
_ONE_THREAD = 1 << 16  # elements below which a C call runs on one thread (no pool wake-up)


@functools.cache
def c_library() -> ctypes.CDLL | None:
    """`csrc/rowwise.c` built and loaded (RMSNorm, SiLU*mul, RoPE in fp32), or None."""
    dll, _ = native.build(SOURCE)
    if dll is None:
        return None
    p, i, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    for name, args, returns in (
            ("parity_rms_norm", [p, p, f, p, p, i, i, i], None),
            ("parity_silu_mul", [p, i, p, i, p, i, i, i], None),
            ("parity_rope", [p, i, p, p, p, i, i, i, i], None),
            ("parity_rope_store", [p, i, p, p, i, i, i, i, p, p, p, p, i], None),
            ("parity_rms_norm_bf16", [p, p, f, p, i, i, i], ctypes.c_int),
            ("parity_silu_mul_bf16", [p, i, p, i, p, i, i, i], ctypes.c_int),
            ("parity_rope_store_bf16", [p, i, p, p, i, i, i, i, p, p, p, p, i], ctypes.c_int)):
        fn = getattr(dll, name)
        fn.argtypes, fn.restype = args, returns
    return dll


def c_threads(numel: int) -> int:
    """Threads for a C call over `numel` values (the bits never depend on it)."""
    return 1 if numel < _ONE_THREAD else torch.get_num_threads()


def serves_c(*ts: torch.Tensor, dtype: torch.dtype = torch.float32) -> bool:
    """Whether the C ops take these tensors: `dtype` (fp32, or bf16 for the bf16 entry
    points) on the CPU, and the library built. A function of the machine, dtype and device
    only, so all callers of an op agree."""
    return all(t.dtype == dtype and t.device.type == "cpu" for t in ts) and (
        c_library() is not None)


def bf16_failed(code: int, op: str) -> None:
    """A bf16 C call's return code: nonzero when it could not get its row buffers."""
    if code:
        raise MemoryError(f"{op} (bf16): out of memory for its row buffers")


def _wants_grad(*ts: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def describe() -> str:
    """What serves the fp32 row-wise ops (RMSNorm, SiLU*mul, RoPE) in this process."""
    dll, what = native.build(SOURCE)
    return f"C: {what}" if dll is not None else f"torch ops ({what})"


def _rms_norm_fwd(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1]
    if d % 16 or not serves_c(x, w):
        # sqrt and division are correctly rounded in every code path; rsqrt need not be.
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return x / rms * w, rms
    x, w = x.contiguous(), w.detach().contiguous()
    y = torch.empty_like(x)
    rms = x.new_empty(*x.shape[:-1], 1)
    c_library().parity_rms_norm(x.data_ptr(), w.data_ptr(), eps, y.data_ptr(), rms.data_ptr(),
                                x.numel() // d, d, c_threads(x.numel()))
    return y, rms


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


def rms_norm_bf16(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor | None:
    """RMSNorm of bf16 rows in one C call: the fp32 C op on their values (w rounded to bf16),
    each output rounded to bf16 once, i.e. the bits of the aligned op's bf16 definition
    (`parity.model.kernels`: computed in fp32, rounded once). None where it does not serve:
    gradients, a width not a multiple of 16, no C library; the caller takes that definition
    through torch's conversions instead."""
    d = x.shape[-1]
    if d % 16 or _wants_grad(x, w) or not serves_c(x, dtype=torch.bfloat16):
        return None
    x, w = x.contiguous(), w.detach().to(torch.bfloat16).contiguous()
    y = torch.empty_like(x)
    bf16_failed(c_library().parity_rms_norm_bf16(x.data_ptr(), w.data_ptr(), eps, y.data_ptr(),
                                                 x.numel() // d, d, c_threads(x.numel())),
                "RMSNorm")
    return y


def rms_norm_standard(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """As Hugging Face's: normalised in at least fp32, scaled in x's dtype."""
    xw = x.to(torch.promote_types(x.dtype, torch.float32))
    return w.to(x.dtype) * (xw * torch.rsqrt(xw.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _silu_mul_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    width = gate.shape[-1]
    if gate.shape == up.shape and width % 16 == 0 and serves_c(gate, up):
        # rows may be apart (gate and up: column slices of one GEMM output), values not
        g2, u2 = (t if t.stride(-1) == 1 else t.contiguous() for t in (gate, up))
        g2, u2 = g2.reshape(-1, width), u2.reshape(-1, width)
        out = torch.empty(gate.shape, dtype=gate.dtype)
        c_library().parity_silu_mul(g2.data_ptr(), g2.stride(0), u2.data_ptr(), u2.stride(0),
                                    out.data_ptr(), g2.shape[0], width, c_threads(out.numel()))
        return out
    d = torch.neg(gate).exp_().add_(1)  # one buffer, updated in place: 1 + e^-gate
    return torch.div(gate, d, out=d).mul_(up)


def silu_mul_bf16(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """SiLU*mul of bf16 rows in one C call, with the bits of the fp32 C op on their values
    rounded to bf16 once (as `rms_norm_bf16`); None where it does not serve."""
    width = gate.shape[-1]
    if (gate.shape != up.shape or width % 16 or _wants_grad(gate, up)
            or not serves_c(gate, up, dtype=torch.bfloat16)):
        return None
    g2, u2 = (t if t.stride(-1) == 1 else t.contiguous() for t in (gate, up))
    g2, u2 = g2.reshape(-1, width), u2.reshape(-1, width)
    out = torch.empty(gate.shape, dtype=gate.dtype)
    bf16_failed(c_library().parity_silu_mul_bf16(g2.data_ptr(), g2.stride(0), u2.data_ptr(),
                                                 u2.stride(0), out.data_ptr(), g2.shape[0],
                                                 width, c_threads(out.numel())), "SiLU*mul")
    return out


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
