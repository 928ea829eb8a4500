"""Continuous batching: which sequences compute how many tokens in the next forward call.

Every step, running sequences go first (a decode row each, or the next chunk of a prompt),
then waiting ones are admitted while the token budget, the sequence limit and the free
blocks allow. Prompts longer than the remaining budget are prefilled in chunks. When the
pool runs out of blocks, the most recently admitted sequence is preempted: its blocks are
released (full ones stay findable in the prefix cache) and it is recomputed later. How
many rows of a prompt one call computes is also bounded by their attention scores, as
`parity.model.layout` counts them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from parity.engine.block_manager import BlockManager
from parity.engine.config import EngineConfig
from parity.engine.sequence import Sequence, Status
from parity.model.layout import rows_within


@dataclass
class Batch:
    """One forward call: `seqs[i]` computes `num_new[i]` tokens after its cached ones."""

    seqs: list[Sequence]
    num_new: list[int]


class Scheduler:
    def __init__(
        self, config: EngineConfig, blocks: BlockManager, heads: int, kv_heads: int
    ) -> None:
        self.config = config
        self.heads, self.kv_heads = heads, kv_heads
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
            n = self._chunk(seq.num_computed, min(seq.num_uncomputed, budget))
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

    def _chunk(self, computed: int, limit: int) -> int:
        """Most of a sequence's next `limit` rows, after `computed` cached ones, whose
        attention scores fit max_attention_scores."""
        return rows_within(
            self.config.max_attention_scores, computed, limit, self.heads, self.kv_heads
        )

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
        return {h for seq in self.running for h in self.blocks.to_compute(seq)}

    def _admit(self, seq: Sequence, budget: int, pending: set[int]) -> int:
        """Start `seq` with its prefix-cache hits; tokens scheduled, 0 = defer, -1 = no room."""
        hits = self.blocks.lookup(seq, pending)
        if hits is None:
            return 0
        reuse_free = sum(1 for b in hits if self.blocks.ref[b] == 0)
        computed = len(hits) * self.bs
        n = self._chunk(computed, min(len(seq.tokens) - computed, budget))
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
        pending.update(self.blocks.to_compute(seq))
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
        seq.num_computed += n
        self.blocks.register(seq, seq.num_computed - n)

    def preempt_all(self) -> None:
        """Send every running sequence back to recompute (after a weight update)."""
        for seq in reversed(list(self.running)):
            self.preempt(seq)

    def _release(self, seq: Sequence) -> None:
        self.blocks.release(seq.block_table)
        seq.block_table = []
        seq.num_computed = 0
