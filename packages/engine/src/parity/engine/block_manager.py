"""Allocation of KV-cache blocks, reference counts, and the prefix cache (hashing included).

A block is free when no sequence references it. A free block may still hold the K/V of a
full block some finished or preempted sequence computed; it stays findable by content
hash until it is handed out again (least recently freed first), so a later request with
the same prefix (the next turn of an episode, another sample of a group) reuses it.

A full block's hash chains its tokens to its parent's hash, so equal hashes mean equal
prefixes; a lookup also compares the block's tokens, so a hash collision is a miss.
"""

from __future__ import annotations

from collections import OrderedDict

from parity.engine.sequence import Sequence


class BlockManager:
    """Blocks 0..num_blocks-1 of the KV pool; `prefix_caching` off: nothing is ever found."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.ref = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}  # content hash -> block holding that full block
        self.block_key: dict[int, tuple[int, tuple[int, ...]]] = {}  # block -> (hash, tokens)

    @property
    def num_free(self) -> int:
        return len(self.free)

    # ------------------------------------------------------------------ hashing

    def hashes(self, seq: Sequence, n_blocks: int) -> list[int]:
        """Chained content hashes of seq's first `n_blocks` full blocks (memoised on seq:
        its tokens are only ever appended to, so a full block's hash never changes)."""
        bs = self.block_size
        while len(seq.block_hashes) < n_blocks:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if i else 0
            seq.block_hashes.append(hash((parent, *seq.tokens[i * bs : (i + 1) * bs])))
        return seq.block_hashes[:n_blocks]

    def to_compute(self, seq: Sequence) -> list[int]:
        """Hashes of seq's full blocks that have no K/V yet (what computing it will add)."""
        if not self.prefix_caching:
            return []
        return self.hashes(seq, len(seq.tokens) // self.block_size)[
            seq.num_computed // self.block_size :
        ]

    def lookup(self, seq: Sequence, pending: set[int]) -> list[int] | None:
        """Blocks caching the longest run of seq's leading full blocks, short of its last
        token (its logits are needed, so it is always computed, in a block of its own).
        None: the next block is in `pending`, being computed by another sequence right now
        (waiting one step turns it into a hit)."""
        usable = (len(seq.tokens) - 1) // self.block_size
        if not self.prefix_caching or not usable:
            return []
        hashes = self.hashes(seq, usable)
        bs = self.block_size
        hits = []
        for i, h in enumerate(hashes):
            b = self.cached.get(h)
            if b is None or self.block_key[b][1] != tuple(seq.tokens[i * bs : (i + 1) * bs]):
                break
            hits.append(b)
        if len(hits) < usable and hashes[len(hits)] in pending:
            return None
        return hits

    def register(self, seq: Sequence, computed_before: int) -> None:
        """seq's blocks that became full since it had `computed_before` tokens computed
        become findable by their content hash."""
        bs = self.block_size
        before, after = computed_before // bs, seq.num_computed // bs
        if not self.prefix_caching or after <= before:
            return
        hashes = self.hashes(seq, after)
        for i in range(before, after):
            block, h = seq.block_table[i], hashes[i]
            if h not in self.cached and block not in self.block_key:
                self.cached[h] = block
                self.block_key[block] = (h, tuple(seq.tokens[i * bs : (i + 1) * bs]))

    # ------------------------------------------------------------------ blocks

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

    def clear_cache(self) -> None:
        """Forget every cached block (after a weight update their K/V are stale)."""
        self.cached.clear()
        self.block_key.clear()

    def _forget(self, block: int) -> None:
        key = self.block_key.pop(block, None)
        if key is not None:
            del self.cached[key[0]]
