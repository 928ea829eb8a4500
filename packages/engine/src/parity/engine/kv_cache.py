"""The paged KV cache: one preallocated pool per layer, addressed through block tables."""

from __future__ import annotations

import torch

from parity.model import ModelConfig, SeqLayout


class KVPool:
    """K and V for every layer: [layers, kv_blocks, block_size, Hkv, D], zeroed once."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype) -> None:
        shape = (cfg.num_hidden_layers, num_blocks, block_size, cfg.kv_heads, cfg.dim_per_head)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.block_size = block_size

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class PagedKV:
    """The KVStore of one forward call.

    `slots` [N]: the pool slot (block * block_size + offset) each new row's K/V goes to.
    `blocks` [S * L / block_size]: each sequence's block table padded to L = layout.max_kv_len
    keys; padding points at block 0, whose values are finite and which attention masks out.
    Whole blocks are gathered (index_select of contiguous block_size x Hkv x D slabs: several
    times faster than gathering single slots).
    """

    def __init__(self, pool: KVPool, slots: torch.Tensor, blocks: torch.Tensor) -> None:
        self.pool, self.slots, self.blocks = pool, slots, blocks

    @classmethod
    def build(cls, pool: KVPool, tables: list[list[int]], layout: SeqLayout) -> PagedKV:
        bs = pool.block_size
        n_blocks = layout.max_kv_len // bs
        padded = torch.tensor([t[:n_blocks] + [0] * (n_blocks - len(t)) for t in tables], dtype=torch.long)
        pos = layout.positions
        slots = padded[layout.seq_of_row, pos // bs] * bs + pos % bs
        return cls(pool, slots, padded.flatten())

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        s, n = len(layout.lengths), layout.max_kv_len
        for store, new in ((self.pool.k[layer], k), (self.pool.v[layer], v)):
            store.view(-1, *store.shape[2:]).index_copy_(0, self.slots, new.to(store.dtype))
            dense = store.index_select(0, self.blocks).view(s, n, *store.shape[2:])
            out.append(dense.transpose(1, 2))  # [S, Hkv, L, D]
        return out[0], out[1]
