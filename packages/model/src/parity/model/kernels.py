"""The decoder's reducing ops in two modes behind one switch.

`aligned` (the default): every op gives each row the same bits whatever the number of rows
in the call, the row's position among them, and the thread count. How, on CPU:
  * GEMMs hand the BLAS one shape class per weight: the rows of every aligned GEMM operand
    (linear inputs, attention query matrices) are zero-padded to a multiple of ROW_TILE, so
    no caller ever reaches the special paths BLAS libraries keep for 1-3 row calls (GEMV,
    small-n kernels) — the paths that made rows differ by batch size on AMD even in MKL's
    strict CNR mode. A linear also runs on at most out_features // COLUMNS_PER_THREAD BLAS
    threads: split finer, MKL hands threads slivers of output columns narrower than a
    vector and computes them on other paths (measured on AMD at 2-32 threads). That the
    BLAS then keeps one reduction order per row for every multiple of ROW_TILE, row offset
    and thread count is proved on this machine, on the model's own shapes, before aligned
    kernels serve (`parity.model.selfcheck`).
  * Attention visits keys in tiles of `KV_TILE` counted from absolute position 0; the
    softmax max is exact in any order, the per-tile sums reduce a fixed-size last
    dimension, and tiles are combined by a pairwise tree that zero tiles cannot change.
    Masked keys contribute exact zeros, so a query sees the same arithmetic whether it is
    row t of a training sequence, a decode step, or any chunked-prefill split, and tiles
    a query cannot see may be skipped (`SeqLayout.groups`).
  * Elementwise transcendental functions avoid kernels whose scalar tail loop differs
    from their vector body (F.silu, sigmoid): silu is x / (1 + exp(-x)), and exp is
    the vectorised library call that treats every element alike.
`standard`: the same math written as anyone would (F.linear with bias, SDPA, F.silu),
used as the contrast the parity audit must catch.

Backward passes need only be correct: aligned ops compute their gradients with ordinary
multi-threaded torch ops (attention with torch's flash-attention backward, from the output
and log-normaliser its forward kept).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import torch
import torch.nn.functional as F

from parity.model.blas import set_local_threads

KernelMode = Literal["aligned", "standard"]
KERNEL_MODES: tuple[KernelMode, ...] = ("aligned", "standard")
ROW_TILE = 8  # rows of every aligned GEMM operand are a multiple of this
COLUMNS_PER_THREAD = 64  # an aligned linear runs on at most out_features // this BLAS threads
ATTENTION_ROW_MULTIPLE = 8  # prefill pieces round their rows up to this (fewer buckets)
KV_TILE = 64
QUERY_CHUNK = 64  # query rows per attention piece (see SeqLayout.groups)
_EXP_FLOOR = -80.0  # e^-80 ~ 1.8e-35: a normal float, far below a sum's last bit


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


# ----------------------------------------------------------------------------- GEMM


def pad_rows(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """x with zero rows appended along `dim` up to a multiple of ROW_TILE (x itself if none)."""
    pad = -x.shape[dim] % ROW_TILE
    if not pad:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_zeros(shape)], dim)


def _gemm(columns: int, fn: Callable[..., torch.Tensor], *args: torch.Tensor | None) -> torch.Tensor:
    """fn(*args) on at most columns // COLUMNS_PER_THREAD BLAS threads (at least one), where
    `columns` counts the call's output columns over all its matrices (module docstring)."""
    cap = columns // COLUMNS_PER_THREAD
    if cap >= torch.get_num_threads():
        return fn(*args)
    before = set_local_threads(max(cap, 1))
    try:
        return fn(*args)
    finally:
        set_local_threads(before)


def _linear_aligned(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    # A multiple of ROW_TILE rows reaches the BLAS whatever the caller's count.
    flat = pad_rows(x.reshape(-1, x.shape[-1])).contiguous()
    y = _gemm(w.shape[0], F.linear, flat, w, b)
    return y[: x.numel() // x.shape[-1]].reshape(*x.shape[:-1], w.shape[0])


# ----------------------------------------------------------------------------- norms, MLP


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


def _rms_norm_aligned(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return _RMSNorm.apply(x, w, eps)
    return _rms_norm_fwd(x, w, eps)[0]


def _rms_norm_standard(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _silu_mul_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    d = torch.neg(gate).exp_().add_(1)  # one buffer, updated in place: 1 + e^-gate
    return torch.div(gate, d, out=d).mul_(up)


class _SiluMul(torch.autograd.Function):
    """Aligned forward; the ordinary derivative of silu(gate) * up for backward."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(gate, up)
        return _silu_mul_fwd(gate, up)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        gate, up = ctx.saved_tensors
        return torch.ops.aten.silu_backward(grad * up, gate), grad * F.silu(gate)


def _silu_mul_aligned(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return _SiluMul.apply(gate, up)
    return _silu_mul_fwd(gate, up)


def _silu_mul_standard(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


# ----------------------------------------------------------------------------- attention


@dataclass
class SeqLayout:
    """How the N query rows of one forward call split into sequences.

    Rows of one sequence are contiguous: sequence s owns rows
    `starts[s] : starts[s] + lengths[s]`, whose absolute positions are `positions[rows]`.
    `kv_lens[s]` is the number of keys sequence s has after this call (its last position
    + 1). Derived index tensors are computed once and shared by every layer.
    """

    starts: list[int]
    lengths: list[int]
    positions: torch.Tensor  # [N] long
    kv_lens: list[int]

    @classmethod
    def from_lengths(cls, lengths: list[int], offsets: list[int] | None = None) -> SeqLayout:
        """Sequences of `lengths` new tokens, each continuing after `offsets[s]` cached ones."""
        offsets = offsets or [0] * len(lengths)
        starts, pos, s = [], [], 0
        for n, off in zip(lengths, offsets, strict=True):
            if n < 1:
                raise ValueError("every sequence in a forward call needs at least one new token")
            starts.append(s)
            pos.append(torch.arange(off, off + n))
            s += n
        kv = [off + n for n, off in zip(lengths, offsets, strict=True)]
        return cls(starts, list(lengths), torch.cat(pos), kv)

    @property
    def num_rows(self) -> int:
        return int(self.positions.shape[0])

    @cached_property
    def seq_of_row(self) -> torch.Tensor:
        """[N] the sequence index of each row."""
        return torch.repeat_interleave(torch.arange(len(self.lengths)), torch.tensor(self.lengths))

    @cached_property
    def max_kv_len(self) -> int:
        return _round_up(max(self.kv_lens), KV_TILE)

    def groups(self, g_heads: int) -> list[_Group]:
        """The query rows cut into pieces and bucketed, so that no piece computes what it cannot see.

        Each sequence's rows are cut into pieces of at most QUERY_CHUNK rows; a piece visits
        only the key tiles its last row can see (causal tiles are skipped, not masked), and a
        decode step is not padded to a prefill (its query matrix, one row per query head,
        is padded to ROW_TILE rows at the matrix level). Pieces are bucketed by row count and
        by their key tile count rounded up to a power of two, which bounds both the wasted
        tiles (< 2x) and the number of buckets. Skipped tiles would only add exact zeros.
        """
        if g_heads not in self._groups:
            self._groups[g_heads] = self._make_groups(g_heads)
        return self._groups[g_heads]

    @cached_property
    def _groups(self) -> dict[int, list[_Group]]:
        return {}

    def attention_scores(self, heads: int, kv_heads: int) -> int:
        """Attention score elements (padded query-matrix rows x KV heads x keys) of one layer."""
        return sum(grp.rows.shape[0] * kv_heads * grp.matrix_rows * grp.kv_len
                   for grp in self.groups(heads // kv_heads))

    def _make_groups(self, g_heads: int) -> list[_Group]:
        buckets: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
        for s, (start, n, kv) in enumerate(zip(self.starts, self.lengths, self.kv_lens, strict=True)):
            for a in range(0, n, QUERY_CHUNK):
                rows = min(QUERY_CHUNK, n - a)
                keys = kv - (n - a - rows)  # what the piece's last row sees
                tiles = 1 << (-(-keys // KV_TILE) - 1).bit_length()
                buckets.setdefault((_query_rows(rows), tiles), []).append((s, start + a, rows, keys))
        out = []
        for (rpad, _), pieces in sorted(buckets.items()):
            seqs, first, n, keys = (list(c) for c in zip(*pieces, strict=True))
            first_t, offset = torch.tensor(first)[:, None], torch.arange(rpad)[None, :]
            valid = offset < torch.tensor(n)[:, None]
            # padded rows repeat the piece's first row: finite, and dropped afterwards
            rows = torch.where(valid, first_t + offset, first_t)
            kv_exact = max(keys)
            out.append(_Group(
                torch.tensor(seqs), rows, valid, self.positions[rows], _round_up(kv_exact, KV_TILE),
                kv_exact, g_heads, seqs == list(range(len(self.lengths))),
            ))
        return out


def _query_rows(n: int) -> int:
    """Rows a piece of n query rows is padded to (by repeating its first row).

    A decode step keeps its single row; longer pieces round up to ATTENTION_ROW_MULTIPLE so
    that pieces of similar length share a bucket. Either way the query matrix (G rows per
    piece row) is then zero-padded to a multiple of ROW_TILE for the GEMMs.
    """
    return 1 if n == 1 else _round_up(n, ATTENTION_ROW_MULTIPLE)


@dataclass
class _Group:
    seqs: torch.Tensor  # [g] the sequence each piece belongs to
    rows: torch.Tensor  # [g, R] row indices into the flat batch
    valid: torch.Tensor  # [g, R] real rows
    positions: torch.Tensor  # [g, R] absolute positions of the rows
    kv_len: int  # keys visited, a multiple of KV_TILE
    kv_exact: int  # the longest piece's real key count
    g_heads: int  # query heads per KV head, stacked in the query matrix
    every_seq: bool  # the pieces are the call's sequences 0..S-1, in order
    out_rows: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.out_rows = self.rows[self.valid]

    @property
    def matrix_rows(self) -> int:
        """Rows of each query matrix the GEMMs see: G*R real ones padded to ROW_TILE."""
        return _round_up(self.g_heads * self.rows.shape[1], ROW_TILE)

    def visible(self, heads: int) -> torch.Tensor:
        """[g, 1, heads*R, L] True where a key is visible: key position <= query position."""
        keys = torch.arange(self.kv_len)
        m = keys[None, None, :] <= self.positions[:, :, None]
        return m.unsqueeze(1).expand(-1, heads, -1, -1).reshape(m.shape[0], 1, -1, self.kv_len)

    @cached_property
    def hidden(self) -> torch.Tensor:
        """[g, 1, G*R, L] the keys each row of the query matrix must not see (every layer's)."""
        return ~self.visible(self.g_heads)

    @cached_property
    def bias(self) -> torch.Tensor:
        """`hidden` as an additive mask: -inf where hidden, 0 elsewhere."""
        return torch.zeros(self.hidden.shape).masked_fill_(self.hidden, float("-inf"))


def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` by adjacent pairs, zero-padded to a power of two.

    Appending zero slices never changes the result bit-wise, so a query gets the same
    sum whether it sees 3 key tiles or 3 real tiles plus 5 masked ones.
    """
    dim = dim % x.dim()
    n = x.shape[dim]
    p = 1 << (n - 1).bit_length()
    if p != n:
        shape = list(x.shape)
        shape[dim] = p - n
        x = torch.cat([x, x.new_zeros(shape)], dim)
    while x.shape[dim] > 1:
        x = x.unflatten(dim, (-1, 2))
        x = x.select(dim + 1, 0) + x.select(dim + 1, 1)
    return x.squeeze(dim)


def _gather_rows(x: torch.Tensor, grp: _Group, hkv: int) -> torch.Tensor:
    """Query-shaped rows x [N, Hq, D] of the group as per-KV-head matrices [g, Hkv, G*R, D]."""
    n_seq, r = grp.rows.shape
    hq, d = x.shape[1], x.shape[2]
    xg = x[grp.rows].view(n_seq, r, hkv, hq // hkv, d).permute(0, 2, 3, 1, 4)
    return xg.reshape(n_seq, hkv, (hq // hkv) * r, d)


def _gather_keys(k: torch.Tensor, grp: _Group) -> torch.Tensor:
    """The group's keys (or values) [g, Hkv, L, D], contiguous: the GEMMs would copy otherwise."""
    k = k[:, :, : grp.kv_len]
    return k.contiguous() if grp.every_seq else k.index_select(0, grp.seqs)


def _gather_group(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grp: _Group
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q rows of the group as [g, Hkv, G*R, D]; its pieces' keys and values [g, Hkv, L, D]."""
    return _gather_rows(q, grp, k.shape[1]), _gather_keys(k, grp), _gather_keys(v, grp)


def _scatter_group(out: torch.Tensor, og: torch.Tensor, grp: _Group) -> None:
    """Write the real rows of per-KV-head matrices og [g, Hkv, G*R, D] back to out [N, Hq, D]."""
    n_seq, r = grp.rows.shape
    hq, d = out.shape[1], out.shape[2]
    hkv = og.shape[1]
    og = og.reshape(n_seq, hkv, hq // hkv, r, d)
    out[grp.out_rows] = og.permute(0, 3, 1, 2, 4).reshape(n_seq, r, hq, d)[grp.valid]


def _attention_aligned_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout, scale: float,
    keep_lse: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Output [N, Hq, D] and, if asked, each group's log-normaliser [g, Hkv, G*R] for backward."""
    out = q.new_empty(q.shape)
    g_heads = q.shape[1] // k.shape[1]
    lses = []
    for grp in layout.groups(g_heads):
        qg, kg, vg = _gather_group(q * scale, k, v, grp)
        real = qg.shape[2]  # G*R rows; the GEMMs see MR = matrix_rows, the softmax only these
        qg = pad_rows(qg, dim=2)  # [g, Hkv, MR, D]
        mats = qg.shape[0] * qg.shape[1]
        s = _gemm(mats * grp.kv_len, torch.matmul, qg, kg.transpose(-1, -2))  # [g, Hkv, MR, L]
        sr = s[:, :, :real].masked_fill_(grp.hidden, float("-inf"))
        m = sr.amax(-1, keepdim=True)
        # MKL's exp takes a slow path when its result underflows; below e^-80 a key's weight
        # is lost in the sum anyway, and hidden keys are zeroed exactly after the exp.
        sr.sub_(m).clamp_(min=_EXP_FLOOR).exp_().masked_fill_(grp.hidden, 0.0)
        s[:, :, real:] = 0.0  # padding rows: zero probabilities, dropped below
        tiles = grp.kv_len // KV_TILE
        pt = s.unflatten(-1, (tiles, KV_TILE))  # [g, Hkv, MR, T, KT]
        denom = tree_sum(pt[:, :, :real].sum(-1), dim=-1).unsqueeze(-1)  # [g, Hkv, G*R, 1]
        pv = _gemm(mats * tiles * vg.shape[-1], torch.matmul, pt.transpose(2, 3),
                   vg.unflatten(2, (tiles, KV_TILE)))  # [g, Hkv, T, MR, D]
        _scatter_group(out, tree_sum(pv[:, :, :, :real], dim=2) / denom, grp)
        if keep_lse:
            lses.append((m + denom.log()).squeeze(-1))
    return out, lses


def _attention_standard(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout, scale: float
) -> torch.Tensor:
    """Padded per-group SDPA with a boolean causal mask: differentiable, any-kernel math."""
    hkv = k.shape[1]
    g_heads = q.shape[1] // hkv
    outs, rows = [], []
    for grp in layout.groups(g_heads):
        qg, kg, vg = _gather_group(q, k, v, grp)
        n_seq, _, gr, d = qg.shape
        r = gr // g_heads
        qh = qg.view(n_seq, hkv * g_heads, r, d)
        n_keys = grp.kv_exact  # no tiles here: keys cut at the longest sequence, as usual
        mask = grp.visible(1)[..., :n_keys]  # [g, 1, R, L]
        o = F.scaled_dot_product_attention(
            qh, kg[:, :, :n_keys], vg[:, :, :n_keys], attn_mask=mask, scale=scale, enable_gqa=True
        )
        o = o.view(n_seq, hkv, g_heads, r, d).permute(0, 3, 1, 2, 4).reshape(n_seq, r, -1, d)
        outs.append(o[grp.valid])
        rows.append(grp.out_rows)
    out = torch.cat(outs)
    order = torch.cat(rows)
    return out[torch.argsort(order)]


class _AlignedAttention(torch.autograd.Function):
    """Aligned forward; the backward is torch's flash-attention backward, given the forward's
    output and log-normaliser, so no [rows x keys] probabilities are kept between the passes."""

    @staticmethod
    def forward(ctx, q, k, v, layout, scale):  # type: ignore[override]
        out, lses = _attention_aligned_fwd(q, k, v, layout, scale, keep_lse=True)
        ctx.save_for_backward(q, k, v, out, *lses)
        ctx.layout, ctx.scale = layout, scale
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, out, *lses = ctx.saved_tensors
        gq, gk, gv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        g_heads = q.shape[1] // k.shape[1]
        for grp, lse in zip(ctx.layout.groups(g_heads), lses, strict=True):
            qg, kg, vg = _gather_group(q, k, v, grp)
            # padding rows repeat a real row: their gradient must not count twice
            dout = _gather_rows(grad, grp, k.shape[1]) * _real_rows(grp, g_heads)
            og = _gather_rows(out, grp, k.shape[1])
            dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout, qg, kg, vg, og, lse, 0.0, False, attn_mask=grp.bias.to(q.dtype), scale=ctx.scale
            )
            _scatter_group(gq, dq, grp)
            # pieces of one sequence may share a group: accumulate, do not overwrite
            gk[:, :, : grp.kv_len].index_add_(0, grp.seqs, dk)
            gv[:, :, : grp.kv_len].index_add_(0, grp.seqs, dv)
        return gq, gk, gv, None, None


def _real_rows(grp: _Group, g_heads: int) -> torch.Tensor:
    """[g, 1, G*R, 1]: 1.0 for real rows of the group's query matrix, 0.0 for padding."""
    n_seq = grp.valid.shape[0]
    return grp.valid.unsqueeze(1).expand(-1, g_heads, -1).reshape(n_seq, 1, -1, 1).float()


def _attention_aligned(q, k, v, layout, scale):
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _AlignedAttention.apply(q, k, v, layout, scale)
    return _attention_aligned_fwd(q, k, v, layout, scale)[0]


# ----------------------------------------------------------------------------- the switch


@dataclass(frozen=True)
class Kernels:
    """One implementation of each reducing op. Signatures:

    linear(x [..., k], w [out, k], b [out] | None) -> [..., out]
    rms_norm(x [..., h], w [h], eps) -> [..., h]
    silu_mul(gate, up) -> silu(gate) * up
    attention(q [N, Hq, D], k [S, Hkv, L, D], v [S, Hkv, L, D], layout, scale) -> [N, Hq, D]
        (k/v hold each sequence's keys from absolute position 0; L is a multiple of KV_TILE)
    log_softmax(logits [..., V]) -> fp32 log-probabilities over the last dim
    """

    mode: KernelMode
    linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    silu_mul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    attention: Callable[..., torch.Tensor]

    @staticmethod
    def log_softmax(logits: torch.Tensor) -> torch.Tensor:
        # A per-row reduction over a fixed-size last dimension: row-invariant as it is.
        return torch.log_softmax(logits.float(), dim=-1)


ALIGNED = Kernels("aligned", _linear_aligned, _rms_norm_aligned, _silu_mul_aligned, _attention_aligned)
STANDARD = Kernels("standard", F.linear, _rms_norm_standard, _silu_mul_standard, _attention_standard)


def get_kernels(mode: KernelMode | str) -> Kernels:
    if mode == "aligned":
        return ALIGNED
    if mode == "standard":
        return STANDARD
    raise ValueError(f"kernels must be 'aligned' or 'standard', not {mode!r}")
