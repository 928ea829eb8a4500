"""A learner rank of a data-parallel group (`learner.ranks` = N > 1).

Each batch is dealt across the N ranks by real tokens (`split_by_tokens`); a rank runs the
Learner's forward and backward on its share, on the full weights, so each sequence's
logprobs are the bits one learner computes (the aligned kernels are batch invariant). What
the Learner reduces over the whole batch stays whole-batch:

* per-sequence rows (logprobs under θ_k and older versions, the sequence gate) are summed
  across ranks with every rank's rows zeroed but its own: x + 0 = x, so the combined rows
  are bit-identical to one learner's, and so are the IS statistics, ESS (VCPO's LR scale),
  the D3 split, the trust region's KL and n_kept, the loss's denominator;
* gradient sums are reduce-scattered (summed, not averaged), then divided by the global
  n_kept and clipped by the global norm exactly as one learner does; the sum's order
  differs from one learner's micro-batch order, so the update agrees to float32 rounding,
  not bit for bit.

Parameters, gradients and AdamW's moments are sharded with FSDP2 (`fully_shard`): between
steps a rank holds 1/N of each parameter (a DTensor), which is what AdamW steps, the trust
region rescales and checkpoints save. The learner's forward (`LogprobFn`) calls the model
in chunks and reads its head outside `forward`, and a rank's micro-batches are not every
rank's, so FSDP's per-forward gathering would neither serve every read nor line the ranks'
collectives up. The full weights are therefore gathered explicitly (`unshard`) once for a
step's forwards and backwards and once for each later forward (trust region, update KL),
and FSDP reduces the accumulated gradients once per step (manual backward finalization).
FSDP refills the gathered storage in place without moving its version counter, and the
aligned GEMMs prepare a weight again only when that counter moves (`parity.model.gemm`), so
every gather marks the parameters changed: without it a rank computes with stale weights.

The recent versions' weights (the D3 history) are kept as each rank's shards and gathered
when used: for publishing (every rank takes part; rank 0 puts them in the object store) and
into a plain copy of the model for the D3 split's shadow forwards and a checkpoint's model.
That copy is made before sharding with its parameters on the meta device: it costs nothing
until used.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from parity.core.timing import COLLECTIVE
from parity.core.types import Trajectory
from parity.model.devices import forget_prepared
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


def _whole(t: Tensor) -> Tensor:
    """`t` whole and detached: a DTensor's shards gathered (a fresh tensor), else a copy."""
    return t.full_tensor().detach() if isinstance(t, DTensor) else t.detach().clone()


class ShardedLearner(Learner):
    """The Learner as rank `dist.get_rank()` of the initialized default process group (gloo
    on CPU, NCCL on GPU); every rank is called with the same batches, in the same order.
    Metrics are the whole batch's on every rank. `model` is sharded in place."""

    model: Any  # the model as FSDP made it: an nn.Module and an FSDPModule

    def __init__(self, cfg: LearnerSettings, model: nn.Module, logprob_fn: LogprobFn) -> None:
        self.rank, self.ranks = dist.get_rank(), dist.get_world_size()
        self._own = torch.zeros(0, dtype=torch.bool)  # [B]: this rank's sequences of the batch
        self._batch: Batch | None = None
        self._unsharded = False  # the model holds the full weights (between unshard and reshard)
        meta = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False)
                for p in model.parameters()}
        self._plain = copy.deepcopy(model, meta)
        device = next(model.parameters()).device.type  # FSDP's default is CUDA where visible
        fully_shard(model, mesh=init_device_mesh(device, (self.ranks,)), reshard_after_forward=False)
        assert isinstance(model, FSDPModule)
        model.set_reshard_after_backward(False)  # gathered until the step's gradients are reduced
        model.set_manual_backward_finalization(True)  # one reduction per step, whatever the share
        model.set_gradient_divide_factor(1.0)  # the gradient's sum; the Learner divides by n_kept
        model.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
        super().__init__(cfg, model, logprob_fn)
        if self.rank:  # rank 0 is the learner of the profile; the others are tracks of their own
            self.timeline.track = f"learner rank {self.rank}"

    def _gather(self) -> bool:
        """Gather the full weights into the model (a collective) unless it holds them;
        whether this call gathered them."""
        if self._unsharded:
            return False
        with self.clock.during(COLLECTIVE):
            self.model.unshard()
        for p in self.model.parameters():  # refilled in place: see the module's docstring
            torch.autograd.graph.increment_version(p)
        self._unsharded = True
        return True

    def _release(self) -> None:
        """Back to this rank's shards: the full weights' storage is freed, and so are the
        aligned GEMMs' prepared copies of them, which the next gather's version bump would
        make stale anyway (they held a full copy of the weights between steps)."""
        forget_prepared(self.model.parameters())
        self.model.reshard()
        self._unsharded = False

    def _train_step(self, groups: list[list[Trajectory]]) -> dict[str, float]:
        self._gather()  # for the step's forwards and backwards; `_reduce_grads` releases it
        return super()._train_step(groups)

    def _micro_batches(self, b: Batch) -> list[list[int]]:
        """This rank's share of `b` in micro-batches; records the share for `_owned_sum`."""
        own = split_by_tokens(b.lengths, self.ranks)[self.rank]
        self._own = torch.zeros(len(b.lengths), dtype=torch.bool)
        self._own[own] = True
        self._batch = b
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
        """The step's gradient sums reduce-scattered onto the ranks' shards; back to shards."""
        if not self._own.any() and self._batch is not None:
            # a rank without a sequence of its own (fewer sequences than ranks) meets the
            # others in the reduction with a zero gradient: 0 × the first sequence's
            with self.clock.during(COLLECTIVE):
                (self._logprobs(self.model, self._batch, [0]).sum() * 0).backward()
        with self.clock.during(COLLECTIVE):
            self.model.finalize_backward()
        self._release()

    def _forward_all(self, b: Batch, mbs: list[list[int]], label: str,
                     rows: set[int] | None = None) -> Tensor:
        gathered_here = self._gather()  # after the update (trust region, update KL): its weights
        out = super()._forward_all(b, mbs, label, rows)
        if gathered_here:
            self._release()
        return self._sum(out)  # 0 outside this share

    def _logprobs_at_versions(self, b: Batch, mbs: list[list[int]], logp_k: Tensor
                              ) -> tuple[Tensor, Tensor, float]:
        logp_v, known, share = super()._logprobs_at_versions(b, mbs, logp_k)
        self._emptied()  # the last shadow version's weights
        return self._owned_sum(logp_v), self._owned_sum(known), share

    def current_weights(self) -> dict[str, Tensor]:
        """The current version's weights, whole: the history keeps this rank's shards of each
        version (`weights()` of the sharded model), gathered here. Every rank calls it."""
        return self._whole_weights(self.history[self.version])

    def _whole_weights(self, weights: dict[str, Tensor]) -> dict[str, Tensor]:
        """`weights` with every DTensor's shards gathered (a collective)."""
        with self.clock.during(COLLECTIVE):
            return {k: _whole(v) for k, v in weights.items()}

    @contextmanager
    def masters(self) -> Iterator[nn.Module]:
        """A plain model holding the full weights as the learner keeps them (a bf16 model's
        fp32 masters), to save as one learner's model, while the context lasts. Every rank
        enters it: a collective."""
        try:
            yield self._holding(self._whole_weights(self.model.state_dict()))
        finally:
            self._emptied()

    def _holding(self, weights: dict[str, Tensor]) -> nn.Module:
        """The plain copy of the model with `weights` in it (in its parameters' dtypes: the
        tensors themselves where those agree, never written to)."""
        dtypes = {k: t.dtype for k, t in self._plain.state_dict().items()}
        self._plain.load_state_dict({k: w.to(dtypes[k]) for k, w in weights.items()}, assign=True)
        self._plain.train(self.model.training)
        return self._plain

    def _emptied(self) -> None:
        """The plain copy back on the meta device: it keeps no weights alive between uses."""
        self._plain.load_state_dict({k: torch.empty_like(t, device="meta")
                                     for k, t in self._plain.state_dict().items()}, assign=True)

    def _shadow_at(self, v: int) -> nn.Module:
        return self._holding(self._whole_weights(self.history[v]))  # every rank forwards versions alike

    def _load_optimizer(self, optimizer: dict[str, Any]) -> None:
        """One learner's AdamW state dict (parameters by index), each rank taking its shards."""
        names = [n for n, _ in self.model.named_parameters()]
        by_name = {"state": {names[i]: s for i, s in optimizer["state"].items()},
                   "param_groups": [g | {"params": [names[i] for i in g["params"]]}
                                    for g in optimizer["param_groups"]]}
        set_optimizer_state_dict(self.model, self.opt, by_name,
                                 options=StateDictOptions(full_state_dict=True))
