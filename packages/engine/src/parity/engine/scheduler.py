"""Continuous batching: which sequences compute how many tokens in the next forward call.

Every step, running sequences go first (a decode row each, or the next chunk of a prompt),
then waiting ones are admitted while the token budget, the sequence limit and the free
blocks allow. Prompts longer than the remaining budget are prefilled in chunks. When the
pool runs out of blocks, the most recently admitted sequence is preempted: its blocks are
released (full ones stay findable in the prefix cache) and it is recomputed later.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from parity.engine.block_manager import BlockManager
from parity.engine.config import EngineConfig
from parity.engine.sequence import Sequence, Status
from parity.model import ATTENTION_ROW_MULTIPLE, KV_TILE


@dataclass
class Batch:
    """One forward call: `seqs[i]` computes `num_new[i]` tokens after its cached ones."""

    seqs: list[Sequence]
    num_new: list[int]


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager, num_heads: int) -> None:
        self.config = config
        self.num_heads = num_heads
        self.blocks = blocks
        self.bs = config.block_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_cached_tokens = 0  # tokens admitted with K/V found in the prefix cache

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Batch:
        budget = self.config.max_batch_tokens
        batch = Batch([], [])
        preempted = self.num_preemptions
        i = 0
        while i < len(self.running) and budget:
            seq = self.running[i]
            n = min(seq.num_uncomputed, budget, self._chunk_cap(seq))
            if not self._grow(seq, n):
                break  # seq itself was preempted; nothing after it is left
            batch.seqs.append(seq)
            batch.num_new.append(n)
            budget -= n
            i += 1
        if not self.waiting or not budget or self.num_preemptions != preempted:
            return batch  # admitting right after a preemption would only thrash
        pending = self._pending_hashes()
        for seq in list(self.waiting):
            if not budget or len(self.running) >= self.config.max_seqs:
                break
            n = self._admit(seq, budget, pending)
            if n < 0:
                break  # out of blocks: later requests wait their turn (no starvation)
            if n:
                batch.seqs.append(seq)
                batch.num_new.append(n)
                budget -= n
        return batch

    def _chunk_cap(self, seq: Sequence) -> int:
        """Most new rows of seq whose attention scores fit max_attention_scores."""
        keys = -(-len(seq.tokens) // KV_TILE) * KV_TILE
        rows = self.config.max_attention_scores // (self.num_heads * keys)
        return max(ATTENTION_ROW_MULTIPLE, rows // ATTENTION_ROW_MULTIPLE * ATTENTION_ROW_MULTIPLE)

    def _blocks_needed(self, seq: Sequence, n: int) -> int:
        return -(-(seq.num_computed + n) // self.bs) - len(seq.block_table)

    def _grow(self, seq: Sequence, n: int) -> bool:
        """Blocks for n more tokens of a running seq, preempting the newest sequences if needed."""
        need = self._blocks_needed(seq, n)
        while self.blocks.num_free < need:
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        seq.block_table += self.blocks.allocate(need)
        return True

    def _pending_hashes(self) -> set[int]:
        """Hashes of full blocks that running sequences are about to compute."""
        out: set[int] = set()
        if not self.config.prefix_caching:
            return out
        for seq in self.running:
            full = len(seq.tokens) // self.bs
            done = seq.num_computed // self.bs
            if done < full:
                out.update(seq.full_block_hashes(full, self.bs)[done:])
        return out

    def _admit(self, seq: Sequence, budget: int, pending: set[int]) -> int:
        """Start `seq` with its prefix-cache hits; tokens scheduled, 0 = defer, -1 = no room."""
        hits: list[int] = []
        # The last token is always computed (its logits are needed), in a block of its own.
        usable = (len(seq.tokens) - 1) // self.bs
        if self.config.prefix_caching and usable:
            hashes = seq.full_block_hashes(usable, self.bs)
            hits = self.blocks.lookup(hashes, seq.tokens)
            # Another sequence is computing our next block right now: wait one step, then hit.
            if len(hits) < usable and hashes[len(hits)] in pending:
                return 0
        reuse_free = sum(1 for b in hits if self.blocks.ref[b] == 0)
        computed = len(hits) * self.bs
        n = min(len(seq.tokens) - computed, budget, self._chunk_cap(seq))
        need = -(-(computed + n) // self.bs) - len(hits)
        if self.blocks.num_free - reuse_free < need:
            return -1
        self.blocks.acquire(hits)
        seq.block_table = hits + self.blocks.allocate(need)
        seq.num_computed = computed
        self.num_cached_tokens += computed
        seq.status = Status.RUNNING
        self.waiting.remove(seq)
        self.running.append(seq)
        if self.config.prefix_caching:
            pending.update(seq.full_block_hashes(len(seq.tokens) // self.bs, self.bs)[len(hits) :])
        return n

    def preempt(self, seq: Sequence) -> None:
        """Release the sequence's blocks; it goes back to the front of the queue."""
        self.running.remove(seq)
        self._release(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        self._release(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason

    def computed(self, seq: Sequence, n: int) -> None:
        """n more tokens of seq have K/V in the cache; newly full blocks join the prefix cache."""
        before = seq.num_computed // self.bs
        seq.num_computed += n
        after = seq.num_computed // self.bs
        if self.config.prefix_caching and after > before:
            hashes = seq.full_block_hashes(after, self.bs)
            for i in range(before, after):
                self.blocks.register(seq.block_table[i], hashes[i], seq.tokens[i * self.bs : (i + 1) * self.bs])

    def preempt_all(self) -> None:
        """Send every running sequence back to recompute (after a weight update)."""
        for seq in reversed(list(self.running)):
            self.preempt(seq)

    def _release(self, seq: Sequence) -> None:
        self.blocks.release(seq.block_table)
        seq.block_table = []
        seq.num_computed = 0
