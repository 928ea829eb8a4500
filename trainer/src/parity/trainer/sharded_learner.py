"""A learner rank of a data-parallel group (`learner.ranks` = N > 1).

Each batch is dealt across the N ranks by real tokens (`split_by_tokens`); a rank runs the
Learner's forward and backward on its share, on the full weights every rank holds, so each
sequence's logprobs are the bits one learner computes (the aligned kernels are batch
invariant). What the Learner reduces over the whole batch stays whole-batch:

* per-sequence rows (logprobs under θ_k and older versions, the sequence gate) are summed
  across ranks with every rank's rows zeroed but its own: x + 0 = x, so the combined rows
  are bit-identical to one learner's, and so are the IS statistics, ESS (VCPO's LR scale),
  the D3 split, the trust region's KL and n_kept, the loss's denominator;
* gradient sums are all-reduced (torch.distributed), then divided by the global n_kept and
  clipped by the global norm exactly as one learner does; the sum's order differs from one
  learner's micro-batch order, so the update agrees to float32 rounding, not bit for bit.

AdamW's moments are sharded: torch's ZeroRedundancyOptimizer steps each parameter on the
rank that owns it and broadcasts the result. Gradients are reduced by explicit all-reduces
rather than DDP's hooks, because the learner's forward (`LogprobFn`) calls the model's parts
in chunks, not DDP's wrapped forward, and accumulates micro-batches DDP would reduce one by
one.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from parity.core.timing import COLLECTIVE
from parity.trainer.learner import Batch, Learner, LearnerSettings, LogprobFn, micro_batches


def split_by_tokens(lengths: Tensor, n: int) -> list[list[int]]:
    """Sequence indices dealt to `n` ranks, balanced by real tokens: longest first (ties: the
    lower index) to the rank with the fewest tokens so far (ties: the lower rank); each
    rank's indices ascending. A function of `lengths` and `n` only."""
    shares: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i)):
        r = min(range(n), key=lambda r: (load[r], r))
        shares[r].append(i)
        load[r] += int(lengths[i])
    return [sorted(s) for s in shares]


class _ZeRO(ZeroRedundancyOptimizer):
    """ZeRO's sharded AdamW, whose step marks every parameter changed: it writes the ones
    other ranks own with `dist.broadcast`, which leaves a tensor's version counter alone, and
    parity's aligned GEMMs prepare a weight again only when that counter moves
    (`parity.model.gemm`): without this, a rank went on computing with stale weights."""

    def step(self, closure: Any = None) -> Any:
        out = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                torch.autograd.graph.increment_version(p)
        return out


class ShardedLearner(Learner):
    """The Learner as rank `dist.get_rank()` of the initialized default process group (gloo
    on CPU, NCCL on GPU); every rank is called with the same batches, in the same order.
    Metrics are the whole batch's on every rank."""

    def __init__(self, cfg: LearnerSettings, model: nn.Module, logprob_fn: LogprobFn) -> None:
        self.rank, self.ranks = dist.get_rank(), dist.get_world_size()
        self._own = torch.zeros(0, dtype=torch.bool)  # [B]: this rank's sequences of the batch
        super().__init__(cfg, model, logprob_fn)
        if self.rank:  # rank 0 is the learner of the profile; the others are tracks of their own
            self.timeline.track = f"learner rank {self.rank}"

    def _optimizer(self) -> torch.optim.Optimizer:
        o = self.cfg.optim
        return _ZeRO(self.model.parameters(), optimizer_class=torch.optim.AdamW, lr=o.lr,
                     betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)

    def _micro_batches(self, b: Batch) -> list[list[int]]:
        """This rank's share of `b` in micro-batches; records the share for `_owned_sum`."""
        own = split_by_tokens(b.lengths, self.ranks)[self.rank]
        self._own = torch.zeros(len(b.lengths), dtype=torch.bool)
        self._own[own] = True
        return [[own[i] for i in mb]
                for mb in micro_batches(b.lengths[own], self.cfg.optim.micro_batch_tokens)]

    def _sum(self, t: Tensor) -> Tensor:
        """`t` summed over the ranks (in place), timed as waiting on the group."""
        with self.clock.during(COLLECTIVE):
            dist.all_reduce(t)
        return t

    def _owned_sum(self, rows: Tensor) -> Tensor:
        """Per-sequence `rows` [B, ...], each from the rank that owns it (exact: x + 0)."""
        return self._sum(torch.where(self._own.view(-1, *[1] * (rows.dim() - 1)), rows,
                                     torch.zeros_like(rows)))

    def _combine(self, logp_k: Tensor, gate: Tensor, total: float) -> tuple[Tensor, Tensor, float]:
        rejected = self._owned_sum((~gate).to(torch.int64))
        loss_sum = self._sum(torch.tensor([total], dtype=torch.float64))
        return self._owned_sum(logp_k), rejected == 0, float(loss_sum)

    def _reduce_grads(self) -> None:
        for p in self.model.parameters():
            if p.requires_grad:
                if p.grad is None:  # a rank whose share missed p (or had no sequence)
                    p.grad = torch.zeros_like(p)
                self._sum(p.grad)

    def _moments(self, p: Tensor) -> dict[str, Tensor]:
        """AdamW's state of `p` on this rank ({} for a parameter another rank owns)."""
        return self.opt.optim.state.get(p, {})

    def _forward_all(self, b: Batch, mbs: list[list[int]], label: str,
                     rows: set[int] | None = None) -> Tensor:
        return self._sum(super()._forward_all(b, mbs, label, rows))  # 0 outside this share

    def _logprobs_at_versions(self, b: Batch, mbs: list[list[int]], logp_k: Tensor
                              ) -> tuple[Tensor, Tensor, float]:
        logp_v, known, share = super()._logprobs_at_versions(b, mbs, logp_k)
        return self._owned_sum(logp_v), self._owned_sum(known), share

    def consolidate(self) -> None:
        """Gather AdamW's shards on rank 0, whose `opt.state_dict()` is then one learner's
        (any N, or one learner, loads it). Every rank calls it: a collective."""
        with self.clock.during(COLLECTIVE):
            self.opt.consolidate_state_dict(to=0)
