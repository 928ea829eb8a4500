"""Trajectories as one right-padded batch, shifted to the logprob positions.

`token_logprobs(model, tokens)` returns lp[:, t] = log π(tokens[t+1] | tokens[:t+1]), so a
trajectory's per-token fields line up with it from position 1 on: mask = loss_mask[1:],
μ = logprobs[1:], versions = versions[1:]. The learner, the SFT warm start and the parity
audit all score trajectories through this one conversion, so they score the same positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from parity.core.types import Trajectory


@dataclass
class TokenBatch:
    """Shapes: tokens [B, T] (zero-padded); lengths [B]; mask, mu, versions [B, T-1], aligned
    to the logprob positions (padding: mask 0, μ 0, version -1)."""

    tokens: Tensor
    lengths: Tensor
    mask: Tensor
    mu: Tensor
    versions: Tensor


def collate(trajs: Sequence[Trajectory]) -> TokenBatch:
    """Pad `trajs` into one batch. A first token marked generated has no logprob position
    (nothing precedes it), so such a trajectory is refused."""
    if not trajs:
        raise ValueError("collate: empty batch")
    T = max(len(t.tokens) for t in trajs)
    B = len(trajs)
    tokens = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T - 1, dtype=torch.float32)
    mu = torch.zeros(B, T - 1, dtype=torch.float64)  # exact for float32 or float64 μ
    versions = torch.full((B, T - 1), -1, dtype=torch.long)
    for i, t in enumerate(trajs):
        n = len(t.tokens)
        if n and t.loss_mask[0]:
            raise ValueError(f"trajectory {t.group_id}: the first token is marked generated")
        tokens[i, :n] = torch.tensor(t.tokens, dtype=torch.long)
        mask[i, : n - 1] = torch.tensor(t.loss_mask[1:], dtype=torch.float32)
        mu[i, : n - 1] = torch.tensor(t.logprobs[1:], dtype=torch.float64)
        versions[i, : n - 1] = torch.tensor(t.versions[1:], dtype=torch.long)
    lengths = torch.tensor([len(t.tokens) for t in trajs])
    return TokenBatch(tokens=tokens, lengths=lengths, mask=mask, mu=mu, versions=versions)
