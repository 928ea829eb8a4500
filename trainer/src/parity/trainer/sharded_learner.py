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
region rescales and checkpoints save. Each decoder layer is an FSDP unit of its own: it is
gathered around its forward (one call per model forward, whatever the chunks:
`parity.model.decoder`) and again around its backward, where its gradient is
reduce-scattered onto the shards; so a rank holds its shards plus about one layer whole.
The rest (the embedding, which is also the tied head, and the final norm) is the root unit,
gathered explicitly (`unshard`) for a step's forwards and backwards and for each later
forward (the trust region, the update's KL), since the learner reads the head outside the
model's forward; its gradient is reduced once per step (manual backward finalization).

The time a rank waits in collectives is its clock's COLLECTIVE state, FSDP's per-layer
gathers and reductions included (`_time_collectives`).

Collectives must meet: every rank makes the same model calls in the same order. The ranks'
micro-batch counts differ (their shares differ), so each rank's list is padded to the
largest with empty micro-batches, on which a rank calls the model on two tokens and, in
training, backwards zero (`_idle`); each model forward is one call per layer (chunks
included), and a layer's input and output are one tensor each, so the backward's gathers
and reductions come in layer order on every rank.

A gathered layer's storage is refilled in place without moving its version counter, and
the aligned GEMMs prepare a weight again only when that counter moves (`parity.model.gemm`):
so every unit drops its weights' prepared copies when it gives up the gathered weights (a
layer after its forward, the root in `_release`); without it a rank would compute with
stale weights, and the copies would hold a whole model besides.

The recent versions' weights (the D3 history) are kept as each rank's shards. The D3 split's
shadow forwards run on the model itself, version v's shards copied into its own for the
while (`_at_version`), gathered a layer at a time like every forward; publishing gathers a
version whole (every rank takes part; rank 0 puts it in the object store), and so does a
checkpoint's model, into a plain copy of the model made before sharding with its parameters
on the meta device: it costs nothing until used.
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

from parity.core.timing import BACKWARD, COLLECTIVE, FORWARD
from parity.core.types import Trajectory
from parity.model.decoder import Layer
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
    """`t` whole, detached and on the CPU: a DTensor's shards gathered (a fresh tensor), else
    a copy."""
    return t.full_tensor().detach().cpu() if isinstance(t, DTensor) else t.detach().to("cpu", copy=True)


class ShardedLearner(Learner):
    """The Learner as rank `dist.get_rank()` of the initialized default process group (gloo
    on CPU, NCCL on GPU); every rank is called with the same batches, in the same order.
    Metrics are the whole batch's on every rank. `model` is sharded in place."""

    model: Any  # the model as FSDP made it: an nn.Module and an FSDPModule
    # the history's shards stay where they are (a GPU rank's on its GPU): `_at_version` copies
    # them back into the model, `_whole` gathers them to the CPU
    kept_on = None

    def __init__(self, cfg: LearnerSettings, model: nn.Module, logprob_fn: LogprobFn) -> None:
        self.rank, self.ranks = dist.get_rank(), dist.get_world_size()
        self._own = torch.zeros(0, dtype=torch.bool)  # [B]: this rank's sequences of the batch
        self._batch: Batch | None = None
        self._unsharded = False  # the model holds the full weights (between unshard and reshard)
        meta = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False)
                for p in model.parameters()}
        self._plain = copy.deepcopy(model, meta)
        device = next(model.parameters()).device.type  # FSDP's default is CUDA where visible
        mesh = init_device_mesh(device, (self.ranks,))
        units = [m for m in model.modules() if isinstance(m, Layer)]
        for layer in units:
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
            # before FSDP's own hook reshards: the module still holds the gathered weights
            layer.register_forward_hook(_forget_gathered, prepend=True)
            self._time_collectives(layer)
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
        assert isinstance(model, FSDPModule)
        model.set_reshard_after_backward(False, recurse=False)  # the root: until `_reduce_grads`
        model.set_manual_backward_finalization(True)  # the root's reduction: once per step
        for unit in [*units, model]:
            assert isinstance(unit, FSDPModule)
            unit.set_gradient_divide_factor(1.0)  # the gradient's sum; the Learner divides by n_kept
            unit.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
        super().__init__(cfg, model, logprob_fn)
        if self.rank:  # rank 0 is the learner of the profile; the others are tracks of their own
            self.timeline.track = f"learner rank {self.rank}"

    def _time_collectives(self, layer: nn.Module) -> None:
        """Time FSDP's collectives of `layer` as COLLECTIVE: its hooks gather the layer before
        its forward and before its backward, and reduce-scatter its gradient after its
        backward. Hooks of ours before and after each of FSDP's switch the clock: forward
        pre-hooks around its pre-forward; gradient hooks on the layer's output around its
        pre-backward (hooks on a tensor run in the order they were registered, and FSDP
        registers its own in its forward hook); autograd functions on the layer's input
        around its post-backward (FSDP wraps the input in one in its pre-forward)."""
        before: list[str | None] = []  # the states the clock left for COLLECTIVE

        def enter(*_: Any) -> None:
            before.append(self.clock.enter(COLLECTIVE))

        def leave(*_: Any) -> None:
            self.clock.enter(before.pop() if before else None)

        def wrap(fn: Any) -> Any:  # a forward pre-hook marking the input's gradient
            def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
                if not (torch.is_grad_enabled() and args[0].requires_grad):
                    return None
                return (_Marker.apply(args[0], fn), *args[1:])
            return hook

        def around_pre_backward(fn: Any) -> Any:  # a forward hook marking the output's gradient
            def hook(module: nn.Module, args: Any, output: Tensor) -> None:
                if torch.is_grad_enabled() and output.requires_grad:
                    output.register_hook(lambda g: fn())
            return hook

        layer.register_forward_pre_hook(lambda *_: enter(), prepend=True)  # before the gather
        layer.register_forward_pre_hook(lambda *_: leave())  # after it
        layer.register_forward_pre_hook(wrap(leave), prepend=True)  # after the reduce-scatter
        layer.register_forward_pre_hook(wrap(enter))  # before it
        layer.register_forward_hook(around_pre_backward(enter), prepend=True)
        layer.register_forward_hook(around_pre_backward(leave))

    def _gather(self) -> bool:
        """Gather the root unit's weights (a collective) unless it holds them; whether this
        call gathered them. The layers gather their own around each forward and backward."""
        if self._unsharded:
            return False
        with self.clock.during(COLLECTIVE):
            self.model.unshard()
        self._unsharded = True
        return True

    def _release(self) -> None:
        """Back to this rank's shards: the root's gathered storage is freed, and so are the
        aligned GEMMs' prepared copies of it (see the module's docstring)."""
        forget_prepared(self.model.parameters())
        self.model.reshard()
        self._unsharded = False

    def _train_step(self, groups: list[list[Trajectory]]) -> dict[str, float]:
        self._gather()  # for the step's forwards and backwards; `_reduce_grads` releases it
        return super()._train_step(groups)

    def _micro_batches(self, b: Batch) -> list[list[int]]:
        """This rank's share of `b` in micro-batches, padded with empty ones to the most any
        rank has (every rank computes every rank's count: no collective); records the share
        for `_owned_sum`."""
        budget = self.cfg.optim.micro_batch_tokens
        shares = split_by_tokens(b.lengths, self.ranks)
        counts = [len(micro_batches(b.lengths[s], budget)) if s else 0 for s in shares]
        own = shares[self.rank]
        self._own = torch.zeros(len(b.lengths), dtype=torch.bool)
        self._own[own] = True
        self._batch = b
        mbs = [[own[i] for i in mb] for mb in micro_batches(b.lengths[own], budget)] if own else []
        return mbs + [[] for _ in range(max(counts) - len(mbs))]

    def _idle(self, train: bool) -> None:
        """The model called on two tokens of the batch, and in training a zero backward from
        them: the rank's layers meet the others' gathers and reductions, adding 0."""
        assert self._batch is not None
        longest = int(self._batch.lengths.argmax())
        tokens = self._batch.packed([longest])[0][:2]
        with self.clock.during(FORWARD):
            lp = self._score(self.model, tokens, [2])
        if train:
            with self.clock.during(BACKWARD):
                (lp.sum() * 0).backward()

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
        """The root's gradient sums reduce-scattered onto the ranks' shards (the layers' were
        in their backwards); back to shards."""
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
        return self._owned_sum(logp_v), self._owned_sum(known), share

    @contextmanager
    def _at_version(self, v: int) -> Iterator[nn.Module]:
        """The model itself computing with version `v`'s weights: v's shards copied into its
        own (the current ones kept aside) while the context lasts. Every rank enters it."""
        self._release()  # the root's gathered weights are the current version's
        params = dict(self.model.named_parameters())
        kept = {k: p.to_local().clone() for k, p in params.items()}
        try:
            with torch.no_grad():
                for k, p in params.items():
                    p.to_local().copy_(self.history[v][k].to_local())
            yield self.model
        finally:
            self._release()  # gathered by the forwards: version v's
            with torch.no_grad():
                for k, p in params.items():
                    p.to_local().copy_(kept[k])

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

    def _load_optimizer(self, optimizer: dict[str, Any]) -> None:
        """One learner's AdamW state dict (parameters by index), each rank taking its shards."""
        names = [n for n, _ in self.model.named_parameters()]
        by_name = {"state": {names[i]: s for i, s in optimizer["state"].items()},
                   "param_groups": [g | {"params": [names[i] for i in g["params"]]}
                                    for g in optimizer["param_groups"]]}
        set_optimizer_state_dict(self.model, self.opt, by_name,
                                 options=StateDictOptions(full_state_dict=True))


def _forget_gathered(module: nn.Module, args: Any, output: Any) -> None:
    """A layer's forward hook: drop the prepared copies of its gathered weights, which FSDP
    is about to free (the module's docstring)."""
    forget_prepared(module.parameters())


class _Marker(torch.autograd.Function):
    """The identity, calling `fn()` when the gradient passes it in the backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, fn: Any) -> Tensor:  # type: ignore[override]
        ctx.fn = fn
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        ctx.fn()
        return grad, None
