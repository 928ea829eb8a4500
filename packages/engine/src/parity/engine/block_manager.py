"""Allocation of KV-cache blocks, reference counts, and the prefix cache.

A block is free when no sequence references it. A free block may still hold the K/V of a
full block some finished or preempted sequence computed; it stays findable by content
hash until it is handed out again (least recently freed first), so a later request with
the same prefix (the next turn of an episode, another sample of a group) reuses it.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockManager:
    """Blocks 0..num_blocks-1 of the KV pool."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}  # content hash -> block holding that full block
        self.block_key: dict[int, tuple[int, tuple[int, ...]]] = {}  # block -> (hash, tokens)

    @property
    def num_free(self) -> int:
        return len(self.free)

    def lookup(self, hashes: list[int], tokens: list[int]) -> list[int]:
        """Blocks caching the longest run of leading full blocks with these hashes."""
        hits = []
        bs = self.block_size
        for i, h in enumerate(hashes):
            b = self.cached.get(h)
            if b is None or self.block_key[b][1] != tuple(tokens[i * bs : (i + 1) * bs]):
                break
            hits.append(b)
        return hits

    def acquire(self, blocks: list[int]) -> None:
        """Add a reference to each (cached) block."""
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks (the caller checked num_free); their cached content is forgotten."""
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            self._forget(b)
            self.ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):  # a sequence's tail is evicted before its shared head
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None

    def register(self, block: int, h: int, tokens: list[int]) -> None:
        """Make a just-computed full block findable by its content hash."""
        if h not in self.cached and block not in self.block_key:
            self.cached[h] = block
            self.block_key[block] = (h, tuple(tokens))

    def clear_cache(self) -> None:
        """Forget every cached block (after a weight update their K/V are stale)."""
        self.cached.clear()
        self.block_key.clear()

    def _forget(self, block: int) -> None:
        key = self.block_key.pop(block, None)
        if key is not None:
            del self.cached[key[0]]
