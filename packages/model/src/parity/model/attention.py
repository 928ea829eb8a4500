"""Attention, aligned and standard.

Aligned, where this machine builds it: the fused kernel of `parity.model.fused` (one query
row at a time, online softmax over key tiles from position 0, in C). Elsewhere, GEMM tiles:
keys in tiles of KV_TILE from absolute position 0; per (piece, KV head) query matrices
whose rows are zero-padded to ROW_TILE for the score and P*V GEMMs (the softmax runs on the real
rows only); the softmax max is exact in any order; per-tile sums reduce a fixed-size dimension;
tiles combine by a pairwise tree that appended zero tiles cannot change, which is why tiles a
piece cannot see may be skipped. A group's pieces run in blocks, and a long piece's softmax in
chunks of its key tiles (`Group.blocks`, `Group.chunk_keys`), so that the scores stay in cache:
each row's arithmetic is the same, chunk trees being subtrees of the tree over all tiles. The
backward is torch's flash-attention backward, fed with the forward's output and log-normaliser.
Standard: padded per-group SDPA, as anyone would write it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from parity.model import fused
from parity.model.gemm import gemm
from parity.model.layout import KV_TILE, Group, PagedKeys, SeqLayout

_EXP_FLOOR = -80.0  # e^-80 ~ 1.8e-35: a normal float, far below a sum's last bit


def tree_sum(x: torch.Tensor, dim: int, width: int | None = None) -> torch.Tensor:
    """Sum over `dim` by adjacent pairs, zero-padded to `width` (a power of two, at least the
    size; by default the size rounded up to one).

    Appending zero slices never changes the result bit-wise, so a query gets the same
    sum whether it sees 3 key tiles or 3 real tiles plus 5 masked ones.
    """
    dim = dim % x.dim()
    n = x.shape[dim]
    p = width or 1 << (n - 1).bit_length()
    if p != n:
        shape = list(x.shape)
        shape[dim] = p - n
        x = torch.cat([x, x.new_zeros(shape)], dim)
    while x.shape[dim] > 1:
        x = x.unflatten(dim, (-1, 2))
        x = x.select(dim + 1, 0) + x.select(dim + 1, 1)
    return x.squeeze(dim)


def _rows(x: torch.Tensor, grp: Group, hkv: int) -> torch.Tensor:
    """Query-shaped rows x [N, Hq, D] of the group as [g, Hkv, G, R, D]: a view when the
    pieces are single rows in order (a decode step), else a gather."""
    n_seq, r = grp.rows.shape
    hq, d = x.shape[1], x.shape[2]
    first = grp.first_row
    xg = x[grp.rows] if first is None else x[first : first + n_seq].unsqueeze(1)
    return xg.view(n_seq, r, hkv, hq // hkv, d).permute(0, 2, 3, 1, 4)


def _gather_rows(x: torch.Tensor, grp: Group, hkv: int) -> torch.Tensor:
    """Query-shaped rows x [N, Hq, D] of the group as per-KV-head matrices [g, Hkv, G*R, D]."""
    xg = _rows(x, grp, hkv)
    return xg.reshape(*xg.shape[:2], -1, xg.shape[-1])


def _gather_keys(k: torch.Tensor, grp: Group) -> torch.Tensor:
    """The group's keys (or values) [g, Hkv, L, D]: a view of consecutive sequences' keys (each
    [L, D] matrix is contiguous, all the GEMMs need), else a gather."""
    k = k[:, :, : grp.kv_len]
    first = grp.first_seq
    return k.index_select(0, grp.seqs) if first is None else k[first : first + len(grp.seqs)]


def _gather_group(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grp: Group
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q rows of the group as [g, Hkv, G*R, D]; its pieces' keys and values [g, Hkv, L, D]."""
    return _gather_rows(q, grp, k.shape[1]), _gather_keys(k, grp), _gather_keys(v, grp)


def _scatter_group(out: torch.Tensor, og: torch.Tensor, grp: Group) -> None:
    """Write the real rows of per-KV-head matrices og [g, Hkv, G*R, D] back to out [N, Hq, D]
    (single rows in order: one copy into a view of out)."""
    n_seq, r = grp.rows.shape
    hq, d = out.shape[1], out.shape[2]
    hkv = og.shape[1]
    if grp.first_row is not None:
        _rows(out, grp, hkv).copy_(og.view(n_seq, hkv, hq // hkv, 1, d))
        return
    og = og.reshape(n_seq, hkv, hq // hkv, r, d)
    out[grp.out_rows] = og.permute(0, 3, 1, 2, 4).reshape(n_seq, r, hq, d)[grp.valid]


def _attention_aligned_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout, scale: float,
    keep_lse: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Output [N, Hq, D] and, if asked, each group's log-normaliser [g, Hkv, G*R] for backward:
    by the fused kernel where this machine builds it (`parity.model.fused`), else by GEMM tiles."""
    if fused.serves(q, k, v):
        out, lse = fused.attention(q, k, v, layout, scale)
        if not keep_lse:
            return out, []
        hkv = k.shape[1]
        g_heads = q.shape[1] // hkv
        return out, [lse[grp.rows].unflatten(-1, (hkv, g_heads)).permute(0, 2, 3, 1).flatten(2)
                     for grp in layout.groups(g_heads)]
    out = q.new_empty(q.shape)
    lses = []
    for grp in layout.groups(q.shape[1] // k.shape[1]):
        norms = [_attend_block(out, q, k, v, blk, scale) for blk in grp.blocks]
        if keep_lse:
            lses.append(torch.cat([(m + denom.log()).squeeze(-1) for m, denom in norms]))
    return out, lses


def _query_matrices(q: torch.Tensor, blk: Group, hkv: int, scale: float) -> torch.Tensor:
    """The block's scaled query rows as per-KV-head matrices [g, Hkv, MR, D]: G*R real rows,
    then zero rows up to ROW_TILE (their scores are exact zeros; their outputs are dropped)."""
    rows = _rows(q, blk, hkv)  # [g, Hkv, G, R, D]
    g_r = rows.shape[2] * rows.shape[3]
    qg = q.new_zeros(rows.shape[0], hkv, blk.matrix_rows, q.shape[2])
    torch.mul(rows, scale, out=qg[:, :, :g_r].unflatten(2, rows.shape[2:4]))
    return qg


def _attend_block(
    out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blk: Group, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write one block's output rows into out; return its softmax max and denominator, each
    [g, Hkv, G*R, 1] (the log-normaliser's parts)."""
    hkv = k.shape[1]
    qg, kg, vg = _query_matrices(q, blk, hkv, scale), _gather_keys(k, blk), _gather_keys(v, blk)
    real = blk.g_heads * blk.rows.shape[1]  # G*R rows; the GEMMs see all MR, the softmax these
    mats = qg.shape[0] * qg.shape[1]
    s = gemm(mats * blk.kv_len, torch.matmul, qg, kg.transpose(-1, -2))  # [g, Hkv, MR, L]
    _mask(s[:, :, :real], blk, 0, float("-inf"))
    m = s[:, :, :real].amax(-1, keepdim=True)
    chunk = blk.chunk_keys
    width = chunk // KV_TILE
    sums, pvs = [], []
    for start in range(0, blk.kv_len, chunk):
        pc = s[..., start : start + chunk]
        # MKL's exp takes a slow path when its result underflows; below e^-80 a key's weight
        # is lost in the sum anyway, and hidden keys are zeroed exactly after the exp.
        pc[:, :, :real].sub_(m).clamp_(min=_EXP_FLOOR).exp_()
        _mask(pc[:, :, :real], blk, start, 0.0)
        pt = pc.unflatten(-1, (-1, KV_TILE))  # [g, Hkv, MR, T, KT]
        sums.append(tree_sum(pt[:, :, :real].sum(-1), dim=-1, width=width))  # [g, Hkv, G*R]
        pv = gemm(mats * pt.shape[3] * vg.shape[-1], torch.matmul, pt.transpose(2, 3),
                  vg[:, :, start : start + chunk].unflatten(2, (-1, KV_TILE)))  # [g, Hkv, T, MR, D]
        pvs.append(tree_sum(pv[:, :, :, :real], dim=2, width=width))  # [g, Hkv, G*R, D]
    denom = tree_sum(torch.stack(sums, -1), dim=-1).unsqueeze(-1)  # [g, Hkv, G*R, 1]
    _scatter_group(out, tree_sum(torch.stack(pvs, 2), dim=2) / denom, blk)
    return m, denom


def _mask(s: torch.Tensor, blk: Group, start: int, value: float) -> None:
    """Set the scores s [g, Hkv, G*R, keys start..] of keys its rows may not see to value;
    only keys from blk.mask_from on can be hidden."""
    first = max(start, blk.mask_from)
    stop = start + s.shape[-1]
    if first < stop:
        hidden = blk.hidden[..., first - blk.mask_from : stop - blk.mask_from]
        s[..., first - start :].masked_fill_(hidden, value)


def attention_standard(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout, scale: float
) -> torch.Tensor:
    """Padded per-group SDPA with a boolean causal mask: differentiable, any-kernel math."""
    if isinstance(k, PagedKeys):
        k, v = k.dense(), v.dense()
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


def _real_rows(grp: Group, g_heads: int) -> torch.Tensor:
    """[g, 1, G*R, 1]: 1.0 for real rows of the group's query matrix, 0.0 for padding."""
    n_seq = grp.valid.shape[0]
    return grp.valid.unsqueeze(1).expand(-1, g_heads, -1).reshape(n_seq, 1, -1, 1).float()


def attention_aligned(q, k, v, layout, scale):
    if isinstance(k, PagedKeys):  # the engine's pool, read in place by the fused kernel
        if fused.serves(q, k.pool, v.pool):
            return fused.attention(q, k.pool, v.pool, layout, scale, k.table)[0]
        k, v = k.dense().to(q.dtype), v.dense().to(q.dtype)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _AlignedAttention.apply(q, k, v, layout, scale)
    return _attention_aligned_fwd(q, k, v, layout, scale)[0]
