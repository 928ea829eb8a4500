"""The GPU set's attention: one kernel for decode, prefill, chunked prefill and prefix
continuation, over dense per-sequence keys or a paged cache.

A program takes one piece of a sequence (up to BLOCK_M // G consecutive query rows, times the
G query heads that share a KV head) and walks that sequence's key tiles of BLOCK_N keys
counted from absolute position 0, in order, with the online softmax: per tile, the scores by
`tl.dot`, the running max, the rescale of the running sum and output, and P*V by `tl.dot` over
the tile's BLOCK_N keys. Every query row therefore meets the same tiles in the same order with
the same instructions whatever path it comes from, and the rows of a tile never mix:

* a decode step, a prefill row and a chunked-prefill row at position p all visit tiles
  0..p // BLOCK_N, with the keys past p masked to exact zeros (the score is -inf, the weight 0);
* a piece walks up to its last row's tile: for its earlier rows the extra tiles are entirely
  masked, and a fully masked tile is an exact no-op (the max is unchanged, so the rescale is
  exactly 1, and the tile adds exact zeros), so they change no bits;
* the tile shape (BLOCK_M, BLOCK_N, the head dim padded to a power of two), warps and stages
  depend on the model's head counts and dtype alone, never on the call.

Keys are found through a block table: a paged cache [blocks, Hkv, block_size, D] with each
sequence's block list, or dense keys [S, Hkv, L, D], read as a cache of S blocks of L keys.
Both forms run the same kernel, so their bits are the same too. The backward recomputes
attention with torch's SDPA, sequence by sequence: only the forward's bits are promised.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.utils.weak import WeakIdKeyDictionary

from parity.model.gpu.launch import OPTIONS, interpreted
from parity.model.layout import SeqLayout

KEY_TILE = 64  # keys per tile, counted from absolute position 0 (the CPU set's KV_TILE)
MIN_ROWS = 64  # query rows per program (G rounded up to 2^k if more): one tile shape for all paths
_LOG2E = 1.0 / math.log(2.0)


def block_rows(g_heads: int) -> int:
    """BLOCK_M: query rows (positions x the G heads of one KV head) per program."""
    return max(MIN_ROWS, triton.next_power_of_2(g_heads))


@triton.jit(do_not_specialize=["n_pieces", "block_size"])
def _attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, table_ptr, pos_ptr, piece_ptr, n_pieces,
                      sq_n, sq_h, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, so_n, so_h, s_tab,
                      block_size, qk_scale,
                      G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_FP32: tl.constexpr):
    piece = tl.program_id(0)
    hk = tl.program_id(1)
    seq = tl.load(piece_ptr + piece)
    row0 = tl.load(piece_ptr + n_pieces + piece)
    n = tl.load(piece_ptr + 2 * n_pieces + piece)
    last = tl.load(piece_ptr + 3 * n_pieces + piece)  # the piece's last (largest) position
    m = tl.arange(0, BLOCK_M)
    real = m // G < n
    qrow = (row0 + m // G).to(tl.int64)
    head = hk * G + m % G
    pos = tl.load(pos_ptr + qrow, mask=real, other=-1)  # padding rows see no key
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_ptr + qrow[:, None] * sq_n + head[:, None] * sq_h + d[None, :],
                mask=real[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for start in range(0, last + 1, BLOCK_N):  # key tiles from position 0, in order
        key = start + tl.arange(0, BLOCK_N)
        live = key <= last
        blk = tl.load(table_ptr + seq * s_tab + key // block_size, mask=live, other=0).to(tl.int64)
        slot = key % block_size
        k = tl.load(k_ptr + blk[None, :] * sk_b + hk * sk_h + slot[None, :] * sk_t + d[:, None],
                    mask=live[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_ptr + blk[:, None] * sv_b + hk * sv_h + slot[:, None] * sv_t + d[None, :],
                    mask=live[:, None] & d_ok[None, :], other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision="ieee") * qk_scale
        s = tl.where(key[None, :] <= pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        # a tile that leaves the max alone rescales by exactly 1 (a masked tile is a no-op)
        alpha = tl.where(m_new == m_i, 1.0, tl.exp2(m_i - m_ref))
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p.to(v_ptr.dtype.element_ty)  # bf16: P rounded once, as the tensor cores take it
        if DOT_FP32:
            p, v = p.to(tl.float32), v.to(tl.float32)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    out = tl.math.div_rn(acc, tl.where(real, l_i, 1.0)[:, None])  # padding rows: no 0 / 0
    tl.store(o_ptr + qrow[:, None] * so_n + head[:, None] * so_h + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=real[:, None] & d_ok[None, :])


# layout -> {(rows per piece, device): (pieces [4, P] int32, positions [N] int32)}
_PIECES: WeakIdKeyDictionary = WeakIdKeyDictionary()


def pieces(layout: SeqLayout, per_piece: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The call's pieces as int32 rows (sequence, first row, rows, last position) [4, P], cut
    every `per_piece` rows from each sequence's first new row, and the rows' positions [N];
    computed once per layout and device (every layer shares them)."""
    cached = _PIECES.setdefault(layout, {})
    key = (per_piece, str(device))
    if key not in cached:
        lengths = torch.tensor(layout.lengths)
        count = (lengths + per_piece - 1) // per_piece
        seq = torch.repeat_interleave(torch.arange(len(lengths)), count)
        first = torch.cumsum(count, 0) - count
        i = torch.arange(len(seq)) - first[seq]
        row0 = torch.tensor(layout.starts)[seq] + i * per_piece
        n = torch.minimum(lengths[seq] - i * per_piece, torch.tensor(per_piece))
        last = layout.positions[row0 + n - 1]
        meta = torch.stack([seq, row0, n, last]).to(torch.int32)
        cached[key] = (meta.to(device), layout.positions.to(torch.int32).to(device))
    return cached[key]


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    tables: torch.Tensor, layout: SeqLayout, scale: float) -> torch.Tensor:
    """Causal attention of q [N, Hq, D] over a paged cache k/v [blocks, Hkv, block_size, D]
    (unit stride in D), sequence s's keys in blocks `tables[s]` ([S, blocks per sequence],
    covering its kv_len keys) -> [N, Hq, D] in q's dtype. Forward only."""
    hq, d = q.shape[1], q.shape[2]
    hkv, block_size = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    bm = block_rows(g)
    meta, pos = pieces(layout, bm // g, q.device)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    n_pieces = meta.shape[1]
    if n_pieces == 0:
        return out
    tables = tables.to(device=q.device, dtype=torch.int32)
    _attention_kernel[(n_pieces, hkv)](
        q, k_cache, v_cache, out, tables, pos, meta, n_pieces,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        tables.stride(0), block_size, scale * _LOG2E,
        G=g, D=d, BLOCK_M=bm, BLOCK_N=KEY_TILE, BLOCK_D=max(16, triton.next_power_of_2(d)),
        DOT_FP32=q.dtype != torch.float32 and interpreted(_attention_kernel),
        num_warps=4, num_stages=2, **OPTIONS)
    return out


def _dense_tables(s: int, device: torch.device) -> torch.Tensor:
    """Dense keys [S, Hkv, L, D] as a cache of S blocks of L keys: sequence s is block s."""
    return torch.arange(s, dtype=torch.int32, device=device)[:, None]


def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout,
                   scale: float) -> torch.Tensor:
    return paged_attention(q, k, v, _dense_tables(k.shape[0], q.device), layout, scale)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout,
              scale: float) -> torch.Tensor:
    """The same attention by torch's SDPA, sequence by sequence (differentiable)."""
    outs = []
    for s, (start, n, kv) in enumerate(zip(layout.starts, layout.lengths, layout.kv_lens,
                                           strict=True)):
        pos = layout.positions[start:start + n].to(q.device)
        mask = torch.arange(kv, device=q.device)[None, :] <= pos[:, None]
        o = F.scaled_dot_product_attention(
            q[start:start + n].transpose(0, 1)[None], k[s:s + 1, :, :kv], v[s:s + 1, :, :kv],
            attn_mask=mask, scale=scale, enable_gqa=True)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


class _Attention(torch.autograd.Function):
    """The kernel's forward; SDPA's gradient, recomputed, for backward."""

    @staticmethod
    def forward(ctx, q, k, v, layout, scale):  # type: ignore[override]
        ctx.save_for_backward(q, k, v)
        ctx.layout, ctx.scale = layout, scale
        return _attention_fwd(q, k, v, layout, scale)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        with torch.enable_grad():
            out = reference(q, k, v, ctx.layout, ctx.scale)
        gq, gk, gv = torch.autograd.grad(out, (q, k, v), grad)
        return gq, gk, gv, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout,
              scale: float) -> torch.Tensor:
    """Causal attention of q [N, Hq, D] over each sequence's keys k/v [S, Hkv, L, D] from
    absolute position 0 (`Kernels.attention`'s form) -> [N, Hq, D] in q's dtype."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Attention.apply(q, k, v, layout, scale)
    return _attention_fwd(q, k, v, layout, scale)
