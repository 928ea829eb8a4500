"""The paged KV cache: one preallocated pool per layer, addressed through block tables."""

from __future__ import annotations

import torch

from parity.model import ModelConfig, SeqLayout


class KVPool:
    """K and V for every layer: [layers, kv_blocks, Hkv, block_size, D], zeroed once.

    Heads come before the block's token slots, so the keys of one (sequence, head) gather
    into one contiguous [L, D] matrix: the layout attention's GEMMs read without a copy.
    """

    def __init__(
        self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype
    ) -> None:
        shape = (cfg.num_hidden_layers, num_blocks, cfg.kv_heads, block_size, cfg.dim_per_head)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.block_size = block_size
        self.heads = torch.arange(cfg.kv_heads)

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
        """K and V of one token slot, every layer: what a memory budget is divided by."""
        return 2 * cfg.num_hidden_layers * cfg.kv_heads * cfg.dim_per_head * dtype.itemsize


class PagedKV:
    """The KVStore of one forward call.

    `slots` [N * Hkv]: where each new row's K/V vector goes, per head, in the pool seen as
    [blocks * Hkv * block_size, D]. `slabs` [S * Hkv * L / block_size]: the [block_size, D]
    slabs (pool seen as [blocks * Hkv, block_size * D]) that make up each sequence's keys of
    each head, in [S, Hkv, L, D] order, from its block table padded to L = layout.max_kv_len
    keys; padding points at block 0, whose values are finite and which attention masks out.
    """

    def __init__(self, pool: KVPool, slots: torch.Tensor, slabs: torch.Tensor) -> None:
        self.pool, self.slots, self.slabs = pool, slots, slabs

    @classmethod
    def build(cls, pool: KVPool, tables: list[list[int]], layout: SeqLayout) -> PagedKV:
        bs, heads = pool.block_size, pool.heads
        n_blocks = layout.max_kv_len // bs
        padded = torch.tensor(
            [t[:n_blocks] + [0] * (n_blocks - len(t)) for t in tables], dtype=torch.long
        )
        pos = layout.positions
        blocks = padded[layout.seq_of_row, pos // bs]
        slots = (
            (blocks[:, None] * len(heads) + heads[None, :]) * bs + (pos % bs)[:, None]
        ).flatten()
        slabs = (padded[:, None, :] * len(heads) + heads[None, :, None]).flatten()
        return cls(pool, slots, slabs)

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        s, n = len(layout.lengths), layout.max_kv_len
        for store, new in ((self.pool.k[layer], k), (self.pool.v[layer], v)):
            d = store.shape[-1]
            store.view(-1, d).index_copy_(0, self.slots, new.to(store.dtype).reshape(-1, d))
            dense = store.view(-1, store.shape[2] * d).index_select(0, self.slabs)
            out.append(dense.view(s, -1, n, d))  # [S, Hkv, L, D]
        return out[0], out[1]
