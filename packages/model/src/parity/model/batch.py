"""Trajectories packed for the model, their per-token fields shifted to the logprob positions.

`packed_logprobs(model, tokens, lengths)` returns, per sequence, lp[t] = log π(x[t+1] | x[:t+1])
for t < n - 1, so a trajectory's per-token fields line up with it from position 1 on:
mask = loss_mask[1:], μ = logprobs[1:], versions = versions[1:]. The learner, the SFT warm
start and the parity audit all score trajectories through this one conversion, so they
score the same positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from parity.core.types import Trajectory


@dataclass
class TokenBatch:
    """B trajectories: their tokens packed as the model reads them, their per-token fields
    as rows of the logprob positions.

    tokens [N]: the sequences back to back (N = Σ lengths, no padding); lengths [B];
    starts[b]: where sequence b begins in `tokens`. mask, mu, versions [B, W], W = the
    longest length − 1: row b holds sequence b's lengths[b] − 1 logprob positions, then
    padding (mask 0, μ 0, version −1). Rows, not packed, because every reduction over them
    (per response: loss, gate, ρ; over the batch: D3, KL) sums in the order of this shape,
    which fixes its bits whatever micro-batch a sequence is scored in.
    """

    tokens: Tensor
    lengths: Tensor
    starts: list[int]
    mask: Tensor
    mu: Tensor
    versions: Tensor

    def packed(self, idx: Sequence[int]) -> tuple[Tensor, list[int]]:
        """The tokens of sequences `idx`, packed in that order, and their lengths."""
        lens = [int(self.lengths[i]) for i in idx]
        tokens = torch.cat([self.tokens[self.starts[i] : self.starts[i] + n]
                            for i, n in zip(idx, lens, strict=True)])
        return tokens, lens

    def rows(self, lp: Tensor, idx: Sequence[int] | None = None) -> Tensor:
        """Packed logprobs of sequences `idx` (default: all), as `packed_logprobs` returns
        them, laid into their rows [len(idx), W], 0 at the padding; differentiable."""
        lengths = self.lengths if idx is None else self.lengths[list(idx)]
        real = torch.arange(self.mask.shape[1]) < (lengths - 1)[:, None]
        return lp.new_zeros(real.shape).masked_scatter(real, lp)


def collate(trajs: Sequence[Trajectory]) -> TokenBatch:
    """Pack `trajs` into one batch. A first token marked generated has no logprob position
    (nothing precedes it), so such a trajectory is refused."""
    if not trajs:
        raise ValueError("collate: empty batch")
    for t in trajs:
        if len(t.tokens) and t.loss_mask[0]:
            raise ValueError(f"trajectory {t.group_id}: the first token is marked generated")
    lengths = torch.tensor([len(t.tokens) for t in trajs])
    B, W = len(trajs), int(lengths.max()) - 1
    mask = torch.zeros(B, W, dtype=torch.float32)
    mu = torch.zeros(B, W, dtype=torch.float64)  # exact for float32 or float64 μ
    versions = torch.full((B, W), -1, dtype=torch.long)
    for i, t in enumerate(trajs):  # copies: the arrays may be read-only views of Ray's buffers
        n = len(t.tokens) - 1
        mask[i, :n] = torch.tensor(t.loss_mask[1:], dtype=torch.float32)
        mu[i, :n] = torch.tensor(t.logprobs[1:], dtype=torch.float64)
        versions[i, :n] = torch.tensor(t.versions[1:], dtype=torch.long)
    tokens = torch.cat([torch.tensor(t.tokens, dtype=torch.long) for t in trajs])
    starts = [0, *torch.cumsum(lengths, 0)[:-1].tolist()]
    return TokenBatch(tokens=tokens, lengths=lengths, starts=starts, mask=mask, mu=mu,
                      versions=versions)
