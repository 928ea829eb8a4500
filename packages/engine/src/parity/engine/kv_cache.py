"""The paged KV cache: one preallocated pool per layer, addressed through block tables, and
the running batch's keys and values kept dense between steps."""

from __future__ import annotations

from collections.abc import Hashable

import torch

from parity.model import ModelConfig, SeqLayout
from parity.model.layout import PagedKeys
from parity.model.rope import apply_rotary, rotate_and_store


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

    # What PagedKV and DenseBatch read of a paged cache (parity's here; vLLM's CPU cache in
    # parity.vllm_plugin): its shape, and per layer where keys and values live.
    stride = 1  # a (block, head)'s key slab is slab (block * Hkv + head) * stride
    layers = property(lambda self: self.k.shape[0])
    head_dim = property(lambda self: self.k.shape[-1])
    dtype = property(lambda self: self.k.dtype)

    def stores(self, layer: int) -> list[tuple[torch.Tensor, int, int]]:
        """Layer's (cache, slot offset, slab offset) for keys, then values: two pools here."""
        return [(self.k[layer], 0, 0), (self.v[layer], 0, 0)]

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
        """K and V of one token slot, every layer: what a memory budget is divided by."""
        return 2 * cfg.num_hidden_layers * cfg.kv_heads * cfg.dim_per_head * dtype.itemsize


class DenseBatch:
    """The running batch's keys and values in the [S, Hkv, capacity, D] form attention reads,
    every layer, kept between steps so that decode does not gather every sequence's keys
    from the pool again at every layer of every step (only the new rows are written).

    It serves a step whose sequences are the ones it holds, in the same order, each
    continuing exactly where it ended, that reads as many keys (padded to KV_TILE) as the
    step that built it: its capacity. Any other step rebuilds it from
    the pool (one gather per layer, as a step without it does) if it fits `max_bytes`, else
    runs without it. The pool stays the record: this holds copies of the same bits, so
    attention reads the same values either way.
    """

    def __init__(self, pool: KVPool, max_bytes: int) -> None:
        self.pool, self.max_bytes = pool, max_bytes
        layers = pool.layers
        # per layer, flat buffers for K and V, reused while large enough
        self.buffers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * layers
        self.seq_ids: list[Hashable] = []
        self.kv_lens: list[int] | None = None  # each sequence's keys held; None while a step writes
        self.capacity = 0
        self.rebuilds = 0  # steps that gathered from the pool into it

    def claim(self, seq_ids: list[Hashable], offsets: list[int], kv_len: int) -> bool | None:
        """Whether a step of these sequences (continuing after `offsets` keys, up to `kv_len`
        keys padded) reads from here: False if served as held, True if rebuilt for them,
        None if it runs without."""
        served = self.seq_ids == seq_ids and self.kv_lens == offsets and kv_len == self.capacity
        self.kv_lens = None  # until the step has written its last layer
        if served:
            return False
        self.forget()
        # exactly the keys the step reads: attention's P*V views its keys and values as
        # [S, Hkv, tiles, KV_TILE, D] batches, which a longer buffer would make it copy
        # (decode then rebuilds once every KV_TILE steps)
        pool = self.pool
        per_layer = len(seq_ids) * len(pool.heads) * kv_len * pool.head_dim * pool.dtype.itemsize
        if 2 * len(self.buffers) * per_layer > self.max_bytes:
            return None
        self.seq_ids, self.capacity = list(seq_ids), kv_len
        self.rebuilds += 1
        return True

    def layer(self, layer: int, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer's K and V buffers of exactly `numel` elements (flat, uninitialised if new)."""
        held = self.buffers[layer]
        if held is None or held[0].numel() < numel:
            held = self.buffers[layer] = (torch.empty(numel, dtype=self.pool.dtype),
                                          torch.empty(numel, dtype=self.pool.dtype))
        return held[0][:numel], held[1][:numel]

    def written(self, kv_lens: list[int]) -> None:
        """A step wrote every layer: the sequences now hold `kv_lens` keys."""
        self.kv_lens = list(kv_lens)

    def forget(self) -> None:
        """Rebuild at the next step (the pool's K/V changed: new weights)."""
        self.seq_ids, self.kv_lens, self.capacity = [], None, 0


class PagedKV:
    """The KVStore of one forward call, over a paged pool: parity's `KVPool`, or any cache
    with its `stride`, `heads`, `block_size`, `layers`, `head_dim`, `dtype` and `stores`
    (vLLM's, in parity.vllm_plugin).

    `slots` [N * Hkv]: where each new row's K/V vector goes, per head, in the pool seen as
    [rows, D]. `slabs` [S * Hkv * L / block_size]: the [block_size, D] slabs (pool seen as
    [slabs, block_size * D]) that make up each sequence's keys of each head, in [S, Hkv, L, D]
    order, from its block table padded to L keys (`block_indices`); each store of
    `pool.stores(layer)` shifts them by its offsets. Padding points at block 0, whose values
    are finite and which attention masks out. With a `dense` batch,
    `rows` [N * Hkv] is where each new row's vectors go in it, seen as [S * Hkv * L, D]; a
    `rebuild` call gathers every layer from the pool into it.
    """

    def __init__(self, pool: KVPool, slots: torch.Tensor, slabs: torch.Tensor,
                 dense: DenseBatch | None = None, rows: torch.Tensor | None = None,
                 rebuild: bool = False, table: torch.Tensor | None = None) -> None:
        self.pool, self.slots, self.slabs = pool, slots, slabs
        self.dense, self.rows, self.rebuild = dense, rows, rebuild
        self.table = table

    @classmethod
    def build(cls, pool: KVPool, tables: list[list[int]] | torch.Tensor, layout: SeqLayout,
              dense: DenseBatch | None = None, seq_ids: list[Hashable] | None = None,
              in_place: bool = False) -> PagedKV:
        """The store of one call (`tables`: each sequence's blocks, as lists or as the rows
        of a tensor). `in_place` (`Decoder.reads_paged`): attention reads the pool through
        the block table, nothing is gathered. Else, with `dense` and the call's `seq_ids`,
        read from `dense` when it holds these sequences or can be rebuilt for them
        (`DenseBatch.claim`), else from a gather."""
        bs, heads = pool.block_size, pool.heads
        length, rebuild = layout.max_kv_len, None
        if in_place:
            dense = None
        if dense is not None and seq_ids is not None:
            offsets = [kv - n for kv, n in zip(layout.kv_lens, layout.lengths, strict=True)]
            rebuild = dense.claim(seq_ids, offsets, length)
        if rebuild is None:
            dense = None
        n_blocks = -(-length // bs)  # a block may hold several key tiles (vLLM's 128 rows)
        if isinstance(tables, torch.Tensor):
            padded = tables[: len(layout.lengths), :n_blocks].long()
            padded = torch.nn.functional.pad(padded, (0, n_blocks - padded.shape[1]))
        else:
            padded = torch.tensor(
                [t[:n_blocks] + [0] * (n_blocks - len(t)) for t in tables], dtype=torch.long
            )
        slots, slabs = block_indices(padded, layout, bs, len(heads), pool.stride)
        if in_place:
            return cls(pool, slots, slabs, table=padded.to(torch.int32))
        rows = None
        if dense is not None:
            rows = ((layout.seq_of_row[:, None] * len(heads) + heads[None, :]) * length
                    + layout.positions[:, None]).flatten()
        return cls(pool, slots, slabs, dense, rows, bool(rebuild))

    def rotate_and_update(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
        sin: torch.Tensor, layout: SeqLayout
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """RoPE on `q` and `k`, then `update` (the KVStore protocol's optional step): where
        attention reads the pool in place, one C call rotates the queries and writes the
        rotated keys and the values into the pool (`rope.rotate_and_store`), the bits of
        `apply_rotary` and `update` without their dozen torch calls per layer."""
        if self.table is not None:
            stores = self.pool.stores(layer)
            (ks, k_at, _), (vs, v_at, _) = stores
            d = self.pool.head_dim
            q_rot = rotate_and_store(q, k, v, cos, sin, ks.view(-1, d)[k_at:],
                                     vs.view(-1, d)[v_at:], self.slots)
            if q_rot is not None:
                return q_rot, *self._in_place(stores, layout.max_kv_len)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, *self.update(layer, k, v, layout)

    def _in_place(self, stores: list[tuple[torch.Tensor, int, int]], length: int
                  ) -> tuple[PagedKeys, PagedKeys]:
        """A layer's keys and values (its `pool.stores`) where they lie in the pool, for
        attention to read."""
        hkv, bs, d = len(self.pool.heads), self.pool.block_size, self.pool.head_dim
        keys = [PagedKeys(store.view(-1, hkv, self.pool.stride, bs, d)[:, :, at_slab],
                          self.table, length) for store, _, at_slab in stores]
        return keys[0], keys[1]

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        s, n = len(layout.lengths), layout.max_kv_len
        hkv, bs, d = len(self.pool.heads), self.pool.block_size, self.pool.head_dim
        if self.table is not None:  # write the new rows; attention reads the pool in place
            stores = self.pool.stores(layer)
            for (store, at_slot, _), new in zip(stores, (k, v), strict=True):
                slots = self.slots + at_slot if at_slot else self.slots
                store.view(-1, d).index_copy_(0, slots, new.to(store.dtype).reshape(-1, d))
            return self._in_place(stores, n)
        held = self.dense.layer(layer, s * hkv * n * d) if self.dense is not None else (None, None)
        out = []
        for (store, at_slot, at_slab), new, buf in zip(self.pool.stores(layer), (k, v), held,
                                                       strict=True):
            slots = self.slots + at_slot if at_slot else self.slots
            if buf is not None and not self.rebuild:  # served: only the new rows change
                new = new.to(store.dtype).reshape(-1, d)
                store.view(-1, d).index_copy_(0, slots, new)
                buf.view(-1, d).index_copy_(0, self.rows, new)
            else:  # every sequence's keys and values, from the pool (into the dense batch)
                slabs = self.slabs + at_slab if at_slab else self.slabs
                buf = write_and_gather(store, slots, slabs, new, bs, buf)
            out.append(buf.view(s, hkv, n, d))
        if self.dense is not None and layer == len(self.dense.buffers) - 1:
            self.dense.written(layout.kv_lens)
        return out[0], out[1]


def block_indices(tables: torch.Tensor, layout: SeqLayout, block_size: int, kv_heads: int,
                  stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Where one call's new rows go and where its sequences' keys come from, in a paged
    cache seen as [slabs, block_size, D] whose (block, head) slab is `(block * kv_heads +
    head) * stride` (stride 1: parity's pools, K and V apart; 2: vLLM's CPU cache, a block's
    key slab then its value slab).

    `tables` [S, L / block_size]: each sequence's blocks, padded to L = layout.max_kv_len keys
    (padding points at a block whose values are finite; attention masks it out). Returns
    `slots` [N * Hkv], each new row's vector per head in the cache seen as [rows, D], and
    `slabs` [S * Hkv * L / block_size], the slabs of every sequence's keys in [S, Hkv, L, D]
    order: the one index both parity's engine and its vLLM plugin read with."""
    heads = torch.arange(kv_heads)
    pos = layout.positions
    blocks = tables[layout.seq_of_row, pos // block_size]
    slots = ((blocks[:, None] * kv_heads + heads[None, :]) * stride * block_size
             + (pos % block_size)[:, None]).flatten()
    slabs = ((tables[:, None, :] * kv_heads + heads[None, :, None]) * stride).flatten()
    return slots, slabs


def write_and_gather(store: torch.Tensor, slots: torch.Tensor, slabs: torch.Tensor,
                     new: torch.Tensor, block_size: int, out: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """Write the new rows' vectors `new` [N, Hkv, D] into `store` (a contiguous paged cache,
    rounded to its dtype) at `slots`, then gather the `slabs` (`block_indices`) into one
    [S * Hkv * L / block_size, block_size * D] tensor (into `out` when given): data moves,
    no arithmetic, so what attention reads is the same bits whoever holds the cache."""
    d = new.shape[-1]
    store.view(-1, d).index_copy_(0, slots, new.to(store.dtype).reshape(-1, d))
    return torch.index_select(store.view(-1, block_size * d), 0, slabs,
                              out=None if out is None else out.view(-1, block_size * d))
