"""Rotary position embeddings with an fp32 cos/sin table shared by every caller.

The table is built in fixed chunks of positions, so the value at position p never depends
on how many positions were requested: training and decode read identical rows.
"""

from __future__ import annotations

import math

import torch

from parity.model import rowwise
from parity.model.config import ModelConfig

_CHUNK = 256


def inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    dim = cfg.dim_per_head
    # fp32 throughout, as Hugging Face computes it, so checkpoints agree with transformers
    inv = 1.0 / (cfg.rope_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    kind, scaling = cfg.rope_kind
    if kind == "linear":
        inv = inv / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
        mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
        inv = torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return inv


class RotaryTable:
    """cos/sin rows by absolute position, grown on demand in fixed-size chunks. Each chunk
    is computed alone (the same ops on the same sizes, so a row's bits never depend on how
    far the table has grown) into buffers whose capacity doubles: a 128K-position table costs
    its own size in copies, not one copy of the whole table per chunk."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.inv_freq = inverse_frequencies(cfg)
        self._cos = torch.empty(0, cfg.dim_per_head)
        self._sin = torch.empty(0, cfg.dim_per_head)
        self.rows = 0  # positions computed: the first `rows` of the buffers

    def _grow(self, n: int) -> None:
        if n <= self.rows:
            return
        need = -(-n // _CHUNK) * _CHUNK
        if need > self._cos.shape[0]:
            cap = max(need, 2 * self._cos.shape[0])
            self._cos = torch.cat([self._cos[: self.rows], self._cos.new_empty(cap - self.rows, self._cos.shape[1])])
            self._sin = torch.cat([self._sin[: self.rows], self._sin.new_empty(cap - self.rows, self._sin.shape[1])])
        for start in range(self.rows, need, _CHUNK):
            pos = torch.arange(start, start + _CHUNK, dtype=torch.float32)
            freqs = torch.outer(pos, self.inv_freq)
            emb = torch.cat([freqs, freqs], dim=-1)
            self._cos[start : start + _CHUNK] = emb.cos()
            self._sin[start : start + _CHUNK] = emb.sin()
        self.rows = need

    def to(self, device: torch.device | str) -> None:
        """The rows computed so far moved to `device` (where `lookup`'s positions live); rows
        grown later are still computed on the CPU, then copied in."""
        self._cos, self._sin = self._cos.to(device), self._sin.to(device)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [N, 1, D] for `positions` [N]."""
        self._grow(int(positions.max()) + 1)
        return self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _rotates_in_c(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether RoPE on x [N, H, D] (fp32 or bf16) is the C rotation: a function of the
    machine, the dtype and the head dim, so every caller of a shape takes the same path."""
    return (x.dim() == 3 and x.shape[-1] % 32 == 0 and cos.shape[1] == 1
            and x.dtype in (torch.float32, torch.bfloat16) and x.device.type == "cpu"
            and rowwise.serves_c(cos, sin))


def _table_rows(cos: torch.Tensor, sin: torch.Tensor, n: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, 1, D] as the [N, D] rows the C calls read."""
    return cos.reshape(n, d).contiguous(), sin.reshape(n, d).contiguous()


def _rope_c(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    n, heads, d = x.shape
    if x.stride(2) != 1 or x.stride(1) != d:  # rows may be apart (a slice of the QKV output)
        x = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype)
    cos, sin = _table_rows(cos, sin, n, d)
    rowwise.c_library().parity_rope(x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(),
                                    y.data_ptr(), n, heads, d, rowwise.c_threads(x.numel()))
    return y


class _RopeC(torch.autograd.Function):
    """The C forward; for backward, the rotation's transpose: x * cos - rotate_half(x * sin)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(cos, sin)
        return _rope_c(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        return grad * cos - _rotate_half(grad * sin), None, None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] rotated as in Hugging Face's rotate_half convention, computed with the
    fp32 table (cos, sin [N, 1, D]) and rounded once to x's dtype. In fp32 and bf16 on a CPU
    with the row-wise C ops (`parity.model.rowwise`), one C call in fp32: every caller of that
    dtype and head dim on the machine takes it."""
    if _rotates_in_c(x, cos, sin):
        if x.dtype == torch.bfloat16:  # the same fp32 math on its values, rounded once
            return apply_rotary(x.float(), cos, sin).to(x.dtype)
        if torch.is_grad_enabled() and x.requires_grad:
            return _RopeC.apply(x, cos, sin)
        return _rope_c(x, cos, sin)
    y = x * cos + _rotate_half(x) * sin
    return y if y.dtype == x.dtype else y.to(x.dtype)


def rotate_and_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor,
                     slots: torch.Tensor) -> torch.Tensor | None:
    """`apply_rotary` on queries and keys and a paged cache's writes as one C call: q [N, Hq,
    D], k and v [N, Hkv, D] the column slices of one fp32 or bf16 QKV output (rows apart,
    heads back to back); the rotated keys and the values go to rows `slots` [N * Hkv] of
    `k_rows` and `v_rows` ([rows, D] of the same dtype, contiguous), pair (row, KV head) by
    pair. Returns the rotated queries [N, Hq, D], with the bits `apply_rotary` gives them (the
    same C rotation, `rope_head`; in bf16 on the widened values, rounded once), or None where
    this call does not serve (the caller rotates and writes as usual): another dtype or
    layout, gradients, or no C library."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    ld, size = q.stride(0), q.element_size()
    if not (q.dtype == k_rows.dtype == v_rows.dtype and _rotates_in_c(q, cos, sin)
            and not (torch.is_grad_enabled() and q.requires_grad)
            and q.stride()[1:] == (d, 1) and k.stride() == v.stride() == q.stride()
            and k.data_ptr() == q.data_ptr() + hq * d * size
            and v.data_ptr() == k.data_ptr() + hkv * d * size
            and k_rows.is_contiguous() and v_rows.is_contiguous()
            and slots.dtype == torch.int64 and slots.is_contiguous()):
        return None
    out = torch.empty(n, hq, d, dtype=q.dtype)
    cos, sin = _table_rows(cos, sin, n, d)
    # bf16: each head widened, rotated by the same C rotation, rounded once (apply_rotary's
    # bf16 bits), the values copied as they are
    call = rowwise.c_library().parity_rope_store_bf16 if q.dtype == torch.bfloat16 else (
        rowwise.c_library().parity_rope_store)
    code = call(q.data_ptr(), ld, cos.data_ptr(), sin.data_ptr(), n, hq, hkv, d, out.data_ptr(),
                k_rows.data_ptr(), v_rows.data_ptr(), slots.data_ptr(),
                rowwise.c_threads(n * (hq + 2 * hkv) * d))
    rowwise.bf16_failed(code or 0, "RoPE and the paged store")
    return out
