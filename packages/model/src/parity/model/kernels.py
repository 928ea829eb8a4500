"""The decoder's reducing ops in two modes behind one switch.

`aligned` (the default): every op gives each row the same bits whatever the number of rows
in the call, the row's position among them, and the thread count. How, on CPU:
  * GEMMs pad their rows to a multiple of `ROW_MULTIPLE` and run single-threaded MKL on
    fixed column blocks (a 2-thread MKL call may split the K reduction; 1-thread calls on
    16-row-padded inputs gave the same bits per row for every row count we probed). The
    blocks run in a small thread pool, so the work still uses both cores; bias is added
    after the product, elementwise.
  * Attention visits keys in tiles of `KV_TILE` counted from absolute position 0; the
    softmax max is exact in any order, the per-tile sums reduce a fixed-size last
    dimension, and tiles are combined by a pairwise tree that zero tiles cannot change.
    Masked keys contribute exact zeros, so a query sees the same arithmetic whether it is
    row t of a training sequence, a decode step, or any chunked-prefill split.
  * Elementwise transcendental functions avoid kernels whose scalar tail loop differs
    from their vector body (F.silu, sigmoid): silu is x / (1 + exp(-x)), and exp is
    the vectorised library call that treats every element alike.
`standard`: the same math written as anyone would (F.linear with bias, SDPA, F.silu),
used as the contrast the parity audit must catch.

Backward passes need only be correct: aligned ops compute their gradients with ordinary
multi-threaded torch ops (attention from the probabilities its forward kept).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import torch
import torch.nn.functional as F

KernelMode = Literal["aligned", "standard"]
KERNEL_MODES: tuple[KernelMode, ...] = ("aligned", "standard")
ROW_MULTIPLE = 16
ATTENTION_ROW_MULTIPLE = 8
KV_TILE = 64
# Column blocks of aligned GEMMs: fixed by the weight's shape only, never by thread count.
_COLUMN_BLOCKS = 2
_MIN_POOL_FLOPS = 4_000_000
_gemm_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


# ----------------------------------------------------------------------------- GEMM


def _column_blocks(n: int) -> list[tuple[int, int]]:
    if n < 2 * ROW_MULTIPLE * _COLUMN_BLOCKS:
        return [(0, n)]
    step = _round_up(math.ceil(n / _COLUMN_BLOCKS), ROW_MULTIPLE)
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def _single_thread_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    torch.set_num_threads(1)  # this pool thread's own OpenMP/MKL setting
    with torch.no_grad():  # grad mode is per thread; gradients come from _AlignedLinear
        return F.linear(x, w)


def aligned_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [n, k] @ w[out, k].T with per-row bits independent of n, row order and threads."""
    global _pool
    n = x.shape[0]
    xp = F.pad(x, (0, 0, 0, (-n) % ROW_MULTIPLE)) if n % ROW_MULTIPLE else x
    blocks = _column_blocks(w.shape[0])
    with _gemm_lock:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            parallel = threads > 1 and len(blocks) > 1
            if parallel and xp.shape[0] * x.shape[1] * w.shape[0] >= _MIN_POOL_FLOPS:
                if _pool is None:
                    _pool = ThreadPoolExecutor(_COLUMN_BLOCKS, thread_name_prefix="parity-gemm")
                outs = list(_pool.map(lambda ab: _single_thread_linear(xp, w[ab[0] : ab[1]]), blocks))
            else:
                outs = [F.linear(xp, w[a:b]) for a, b in blocks]
        finally:
            torch.set_num_threads(threads)
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    return out[:n]


class _AlignedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, w)
        return aligned_matmul(x, w)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:  # type: ignore[override]
        x, w = ctx.saved_tensors
        gx = g @ w if ctx.needs_input_grad[0] else None
        gw = g.t() @ x if ctx.needs_input_grad[1] else None
        return gx, gw


def _linear_aligned(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        out = _AlignedLinear.apply(flat, w)
    else:
        out = aligned_matmul(flat, w)
    if b is not None:
        out = out + b
    return out.reshape(*shape[:-1], w.shape[0])


# ----------------------------------------------------------------------------- norms, MLP


def _rms_norm_aligned(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # sqrt and division are correctly rounded in every code path; rsqrt need not be.
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rms_norm_standard(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _silu_mul_aligned(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return gate / (1 + torch.exp(-gate)) * up


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
        """Sequences bucketed by padded row count, so a decode step does not pad to a prefill.

        Each sequence's rows are padded so that the query matrix of one KV head (g_heads
        query heads × rows) has a multiple of ATTENTION_ROW_MULTIPLE rows.
        """
        if g_heads not in self._groups:
            self._groups[g_heads] = self._make_groups(g_heads)
        return self._groups[g_heads]

    @cached_property
    def _groups(self) -> dict[int, list[_Group]]:
        return {}

    def _make_groups(self, g_heads: int) -> list[_Group]:
        step = ATTENTION_ROW_MULTIPLE // math.gcd(g_heads, ATTENTION_ROW_MULTIPLE)
        buckets: dict[int, list[int]] = {}
        for s, n in enumerate(self.lengths):
            buckets.setdefault(_round_up(n, step), []).append(s)
        out = []
        for rpad, seqs in sorted(buckets.items()):
            rows = torch.zeros(len(seqs), rpad, dtype=torch.long)
            valid = torch.zeros(len(seqs), rpad, dtype=torch.bool)
            for i, s in enumerate(seqs):
                rows[i, : self.lengths[s]] = torch.arange(self.starts[s], self.starts[s] + self.lengths[s])
                valid[i, : self.lengths[s]] = True
            # padded rows repeat the sequence's first row: finite, and dropped afterwards
            rows = torch.where(valid, rows, rows[:, :1])
            kv_exact = max(self.kv_lens[s] for s in seqs)
            out.append(_Group(
                torch.tensor(seqs), rows, valid, self.positions[rows], _round_up(kv_exact, KV_TILE), kv_exact
            ))
        return out


@dataclass
class _Group:
    seqs: torch.Tensor  # [g] sequence indices
    rows: torch.Tensor  # [g, R] row indices into the flat batch
    valid: torch.Tensor  # [g, R] real rows
    positions: torch.Tensor  # [g, R] absolute positions of the rows
    kv_len: int  # keys visited, a multiple of KV_TILE
    kv_exact: int  # the longest sequence's real key count
    out_rows: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.out_rows = self.rows[self.valid]

    def mask(self, g_heads: int) -> torch.Tensor:
        """[g, 1, G*R, L] True where a key is visible: key position <= query position."""
        keys = torch.arange(self.kv_len)
        m = keys[None, None, :] <= self.positions[:, :, None]
        return m.unsqueeze(1).expand(-1, g_heads, -1, -1).reshape(m.shape[0], 1, -1, self.kv_len)


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


def _gather_group(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grp: _Group
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q rows of the group as [g, Hkv, G*R, D]; its sequences' keys and values [g, Hkv, L, D]."""
    n_seq, r = grp.rows.shape
    hq, d = q.shape[1], q.shape[2]
    hkv = k.shape[1]
    qg = q[grp.rows].view(n_seq, r, hkv, hq // hkv, d).permute(0, 2, 3, 1, 4)
    qg = qg.reshape(n_seq, hkv, (hq // hkv) * r, d)
    return qg, k[grp.seqs, :, : grp.kv_len], v[grp.seqs, :, : grp.kv_len]


def _scatter_group(out: torch.Tensor, og: torch.Tensor, grp: _Group) -> None:
    n_seq, r = grp.rows.shape
    hq, d = out.shape[1], out.shape[2]
    hkv = og.shape[1]
    og = og.view(n_seq, hkv, hq // hkv, r, d).permute(0, 3, 1, 2, 4).reshape(n_seq, r, hq, d)
    out[grp.out_rows] = og[grp.valid]


def _attention_aligned_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout, scale: float,
    keep_probs: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Output [N, Hq, D] and, if asked, each group's normalised probabilities for backward."""
    out = q.new_empty(q.shape)
    g_heads = q.shape[1] // k.shape[1]
    probs = []
    for grp in layout.groups(g_heads):
        qg, kg, vg = _gather_group(q, k, v, grp)
        s = torch.matmul(qg, kg.transpose(-1, -2)) * scale  # [g, Hkv, GR, L]
        s = s.masked_fill(~grp.mask(g_heads), float("-inf"))
        p = torch.exp(s - s.amax(-1, keepdim=True))
        tiles = grp.kv_len // KV_TILE
        pt = p.unflatten(-1, (tiles, KV_TILE))  # [g, Hkv, GR, T, KT]
        denom = tree_sum(pt.sum(-1), dim=-1).unsqueeze(-1)  # [g, Hkv, GR, 1]
        pv = torch.matmul(pt.transpose(2, 3), vg.unflatten(2, (tiles, KV_TILE)))  # [g,Hkv,T,GR,D]
        _scatter_group(out, tree_sum(pv, dim=2) / denom, grp)
        if keep_probs:
            probs.append(p / denom)
    return out, probs


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
        kh = kg[:, :, :n_keys].repeat_interleave(g_heads, dim=1)
        vh = vg[:, :, :n_keys].repeat_interleave(g_heads, dim=1)
        mask = grp.mask(1)[..., :n_keys]  # [g, 1, R, L]
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        o = o.view(n_seq, hkv, g_heads, r, d).permute(0, 3, 1, 2, 4).reshape(n_seq, r, -1, d)
        outs.append(o[grp.valid])
        rows.append(grp.out_rows)
    out = torch.cat(outs)
    order = torch.cat(rows)
    return out[torch.argsort(order)]


class _AlignedAttention(torch.autograd.Function):
    """Aligned forward; the usual softmax-attention backward from the saved probabilities."""

    @staticmethod
    def forward(ctx, q, k, v, layout, scale):  # type: ignore[override]
        out, probs = _attention_aligned_fwd(q, k, v, layout, scale, keep_probs=True)
        ctx.save_for_backward(q, k, v, out, *probs)
        ctx.layout, ctx.scale = layout, scale
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, out, *probs = ctx.saved_tensors
        gq, gk, gv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        g_heads = q.shape[1] // k.shape[1]
        for grp, p in zip(ctx.layout.groups(g_heads), probs, strict=True):
            qg, kg, vg = _gather_group(q, k, v, grp)
            # padding rows repeat a real row: their gradient must not count twice
            dout = _gather_group(grad, k, v, grp)[0] * _real_rows(grp, g_heads)
            og = _gather_group(out, k, v, grp)[0]
            ds = p * (dout @ vg.transpose(-1, -2) - (dout * og).sum(-1, keepdim=True)) * ctx.scale
            _scatter_group(gq, ds @ kg, grp)
            gk[grp.seqs, :, : grp.kv_len] += ds.transpose(-1, -2) @ qg
            gv[grp.seqs, :, : grp.kv_len] += p.transpose(-1, -2) @ dout
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
