"""The model side of one engine step: one `Decoder.forward` over every scheduled row (decode
rows and prefill chunks together, K/V in the paged pool), then the next token of each
sequence whose tokens are now all computed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.engine.kv_cache import DenseBatch, KVPool, PagedKV
from parity.engine.sampler import next_tokens
from parity.engine.scheduler import Batch
from parity.engine.sequence import Sequence
from parity.model import Decoder, SeqLayout


@dataclass
class Sampled:
    """What one step drew: `tokens[i]` and its recorded `logprobs[i]` continue `seqs[i]`."""

    seqs: list[Sequence]
    tokens: list[int]
    logprobs: list[float]


class ModelRunner:
    def __init__(self, model: Decoder, num_blocks: int, block_size: int, dense_kv_mib: int) -> None:
        self.model = model.eval()
        self.pool = KVPool(model.config, num_blocks, block_size, model.compute_dtype)
        self.dense = DenseBatch(self.pool, dense_kv_mib * 2**20)
        self.peak_attention_scores = 0  # largest score matrix of one step (elements, all heads)

    def run(self, batch: Batch) -> Sampled:
        """Compute the batch's rows; sample the sequences that reach the end of their tokens."""
        hidden, layout = self._forward(batch)
        ready = [
            i
            for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new, strict=True))
            if seq.num_computed + n == len(seq.tokens)
        ]
        if not ready:
            return Sampled([], [], [])
        seqs = [batch.seqs[i] for i in ready]
        rows = [layout.starts[i] + batch.num_new[i] - 1 for i in ready]
        with torch.no_grad():
            tokens, logprobs = next_tokens(self.model, hidden[rows], seqs)
        return Sampled(seqs, tokens, logprobs)

    def _forward(self, batch: Batch) -> tuple[torch.Tensor, SeqLayout]:
        flat: list[int] = []
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            flat += seq.tokens[seq.num_computed : seq.num_computed + n]
        layout = SeqLayout.from_lengths(batch.num_new, [s.num_computed for s in batch.seqs])
        if not self.model.reads_paged:  # the fused kernel holds no score matrix to count
            cfg = self.model.config
            scores = layout.attention_scores(cfg.num_attention_heads, cfg.kv_heads)
            self.peak_attention_scores = max(self.peak_attention_scores, scores)
        kv = PagedKV.build(self.pool, [s.block_table for s in batch.seqs], layout, self.dense,
                           [s.seq_id for s in batch.seqs], in_place=self.model.reads_paged)
        with torch.no_grad():
            return self.model(torch.tensor(flat), layout, kv), layout
