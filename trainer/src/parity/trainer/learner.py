"""The learner: logprobs under θ_k, the REINFORCE Zero loss with gradient accumulation to a
token budget, AdamW with clipping and an LR schedule, the IS statistics, and the recent
versions' weights that split D3 into numerical mismatch and policy lag.

The batch is packed once (`parity.model.batch`): the model reads each micro-batch's real
tokens back to back, and its logprobs lp[t] = log π(x[t+1] | x[:t+1]) are laid once into
the rows of the logprob positions, where μ = logprobs[1:], mask = loss_mask[1:] and
versions = versions[1:].
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from parity.core.timing import (
    BACKWARD,
    D3_SPLIT,
    FORWARD,
    LEARNER_OTHER,
    OPTIMIZER,
    WAITING,
    StateClock,
    Timeline,
)
from parity.core.types import Trajectory
from parity.model.batch import TokenBatch
from parity.model.batch import collate as collate_trajectories
from parity.trainer.checkpoint import load_optimizer
from parity.trainer.config import LossSection, OptimSection, TrainConfig
from parity.trainer.is_stats import (
    ess_frac,
    kl_k2,
    peak_over_median,
    sequence_log_ratio,
    split_d3,
)
from parity.trainer.loss import group_advantages, lr_at, reinforce_zero_loss, vcpo_lr_scale

LogprobFn = Callable[..., Tensor]  # (model, tokens [N] packed, lengths: list[int],
#                                    temperature=, chunk_size=) -> [N - B] packed

TRUST_TRIES = 4
"""At most this many shrinks of one update by the trust region (each measured again)."""


@dataclass
class Batch(TokenBatch):
    """Responses collated for the learner (`parity.model.batch`), one row per token sequence
    (an episode of k segments has k rows), with per row: rewards, group indices, `weights`
    (1/k) and `firsts` (True on the row that stands for its episode in the baseline) [B]."""

    rewards: Tensor
    groups: Tensor
    weights: Tensor
    firsts: Tensor


def collate(groups: list[list[Trajectory]]) -> Batch:
    """Pack the responses of `groups` (one list per prompt), every segment of each."""
    rows = [(gi, t, s, i == 0) for gi, g in enumerate(groups) for t in g
            for i, s in enumerate(t.segments)]
    return Batch(
        **vars(collate_trajectories([s for _, _, s, _ in rows])),
        rewards=torch.tensor([t.reward for _, t, _, _ in rows], dtype=torch.float64),
        groups=torch.tensor([gi for gi, _, _, _ in rows]),
        weights=torch.tensor([1 / len(t.segments) for _, t, _, _ in rows], dtype=torch.float64),
        firsts=torch.tensor([first for _, _, _, first in rows]),
    )


def micro_batches(lengths: Tensor, budget: int) -> list[list[int]]:
    """Consecutive index runs whose real tokens (Σ lengths) stay ≤ `budget`; a sequence
    longer than the budget gets a micro-batch of its own."""
    out: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for i, n in enumerate(lengths.tolist()):
        if cur and size + n > budget:
            out.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += n
    if cur:
        out.append(cur)
    return out


@dataclass(frozen=True)
class LearnerSettings:
    """What the learner reads of a run's config (made by `of`; the defaults are the config's)."""

    loss: LossSection
    optim: OptimSection
    temperature: float  # rollout.temperature: π_θ at the temperature the rollouts sampled at
    steps: int  # train.steps: the LR schedule's length
    max_lag: int  # versions kept for the D3 split (0 in sync mode)
    track_mismatch: bool  # train.track_mismatch: split D3 into mismatch and lag
    mismatch_share: float  # train.mismatch_share: older sequences the split recomputes
    track_update_kl: bool  # train.track_update_kl: kl/update after each step

    @classmethod
    def of(cls, cfg: TrainConfig) -> LearnerSettings:
        optim = cfg.optim.model_copy(update={"max_update_kl": cfg.max_update_kl})  # in effect
        return cls(cfg.loss, optim, cfg.rollout.temperature, cfg.train.steps, cfg.max_lag,
                   cfg.train.track_mismatch, cfg.train.mismatch_share, cfg.train.track_update_kl)


class Learner:
    """Owns the trained model, its optimizer and the last `max_lag + 1` versions' weights.

    `version` k = number of updates applied; the weights after update k are version k.
    The process's RNGs belong to its owner (the learner actor seeds them); `state()` saves
    them for resume."""

    kept_on: str | None = "cpu"
    """Where `weights()` copies go (the D3 history, what publishing hands out): the CPU; None
    keeps them on the model's device (a sharded rank's shards, `ShardedLearner`)."""

    def __init__(self, cfg: LearnerSettings, model: nn.Module, logprob_fn: LogprobFn) -> None:
        self.cfg = cfg
        self.model = model
        self.logprob_fn = logprob_fn
        self.timeline = Timeline("learner")
        self.clock = StateClock(self.timeline, WAITING)  # the learner's exclusive state
        self.opt = self._optimizer()
        self.version = 0
        self.history: dict[int, dict[str, Tensor]] = {0: self.weights()}
        self._shadow: nn.Module | None = None  # loads older versions for the D3 split
        self.skipped_nonfinite = 0

    def _optimizer(self) -> torch.optim.Optimizer:
        """AdamW over the model's parameters (a sharded learner shards its state)."""
        o = self.cfg.optim
        return torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps,
                                 weight_decay=o.weight_decay)

    def _micro_batches(self, b: Batch) -> list[list[int]]:
        """The micro-batches this learner computes: all of the batch's sequences."""
        return micro_batches(b.lengths, self.cfg.optim.micro_batch_tokens)

    def _combine(self, logp_k: Tensor, gate: Tensor, total: float) -> tuple[Tensor, Tensor, float]:
        """The whole batch's logprobs, gate and loss sum from this learner's share: its own."""
        return logp_k, gate, total

    def _reduce_grads(self) -> None:
        """The whole batch's gradient sum from this learner's share: already in place."""

    def _idle(self, train: bool) -> None:
        """A micro-batch with none of the sequences a pass computes: nothing to do here (a
        sharded learner's rank still meets the other ranks in its layers' collectives)."""

    def _moments(self, p: Tensor) -> dict[str, Tensor]:
        """AdamW's state of parameter `p` ({} before its first step)."""
        return self.opt.state.get(p, {})

    def weights(self) -> dict[str, Tensor]:
        """A copy of the current weights (HF parameter names) on `kept_on`, in the dtype the
        model computes in: a bf16 model's fp32 masters are published rounded, as its forward
        uses them."""
        dtype = getattr(self.model, "compute_dtype", None)
        return {k: v.detach().to(self.kept_on, dtype=dtype, copy=True)
                for k, v in self.model.state_dict().items()}

    def current_weights(self) -> dict[str, Tensor]:
        """The current version's `weights()`, the copy the D3 history keeps: what publishing
        hands out, without copying again. Shared: never to be mutated (history entries are
        only replaced or dropped)."""
        return self.history[self.version]

    def _logprobs(self, model: nn.Module, b: Batch, idx: list[int]) -> Tensor:
        """`model`'s logprobs of sequences `idx`, one packed forward (each sequence in
        chunks with optim.chunk_tokens), in their rows [len(idx), W]."""
        tokens, lengths = b.packed(idx)
        return b.rows(self._score(model, tokens, lengths), idx)

    def _score(self, model: nn.Module, tokens: Tensor, lengths: list[int]) -> Tensor:
        """`logprob_fn` of packed `tokens` on `model`'s device (a GPU learner's), the packed
        logprobs back on the CPU, where the batch and the loss are: the copy is
        differentiable, so the backward crosses back to the model's device."""
        device = next(model.parameters()).device
        lp = self.logprob_fn(model, tokens.to(device), lengths, temperature=self.cfg.temperature,
                             chunk_size=self.cfg.optim.chunk_tokens)
        return lp.to("cpu")

    def train_step(self, groups: list[list[Trajectory]]) -> dict[str, float]:
        """One update on complete groups; returns the step's learner metrics."""
        with self.clock.during(LEARNER_OTHER):  # what the states inside leave: collate, stats
            return self._train_step(groups)

    def _train_step(self, groups: list[list[Trajectory]]) -> dict[str, float]:
        k = self.version
        tl = self.timeline
        clock = self.clock
        tl.step = k
        cfg = self.cfg
        b = collate(groups)
        mbs = self._micro_batches(b)
        logp_k = torch.zeros_like(b.mu)
        self.model.train()
        self.opt.zero_grad(set_to_none=True)

        if cfg.loss.vcpo_baseline:  # b* needs every ρ_i before the first backward
            logp_k = self._forward_all(b, mbs, "logprobs θ_k (baseline)")
            log_rho = sequence_log_ratio(logp_k - b.mu, b.mask)
        else:
            log_rho = None
        # an episode's k segments: its advantage once in the baseline, 1/k of it on each
        adv = group_advantages(b.rewards, b.groups, cfg.loss, log_rho, b.firsts) * b.weights

        gate = torch.ones(len(b.lengths), dtype=torch.bool)
        total = 0.0
        for idx in mbs:
            if not idx:
                self._idle(train=True)
                continue
            with clock.during(FORWARD), tl.span("forward", "learner_fwd",
                                                 tokens=int(b.lengths[idx].sum())):
                lp = self._logprobs(self.model, b, idx)
                loss, gate[idx] = reinforce_zero_loss(lp, b.mu[idx], b.mask[idx], adv[idx],
                                                      cfg.loss)
            with clock.during(BACKWARD), tl.span("backward", "learner_bwd"):
                loss.backward()
            logp_k[idx] = lp.detach().double()
            total += float(loss.detach())
        logp_k, gate, total = self._combine(logp_k, gate, total)
        n_kept = float(b.weights[gate & (b.mask.sum(-1) > 0)].sum())  # episodes, in 1/k parts
        self._reduce_grads()  # first: a sharded learner's full weights and gradients go
        stats = self._is_stats(b, mbs, logp_k, gate)
        with clock.during(OPTIMIZER), tl.span("optimizer", "optim"):
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.div_(n_kept or 1.0)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                             cfg.optim.grad_clip))
            lr = lr_at(k, cfg.steps, cfg.optim.lr, cfg.optim.schedule,
                       cfg.optim.warmup_steps, cfg.optim.min_lr_ratio)
            lr *= vcpo_lr_scale(stats["is/ess_frac"], cfg.loss.vcpo_lr)
            finite = math.isfinite(total) and math.isfinite(grad_norm)
            bounded = finite and bool(cfg.optim.max_update_kl)
            if bounded:
                before = [p.detach().clone() for p in self.model.parameters()]
            if finite:
                for g in self.opt.param_groups:
                    g["lr"] = lr
                self.opt.step()
            else:  # a NaN/inf loss or gradient skips the update, counted
                self.skipped_nonfinite += 1
            self.opt.zero_grad(set_to_none=True)
            if bounded:
                stats |= self._bound_update(b, mbs, logp_k, before)
        if cfg.track_update_kl:
            stats["kl/update"] = self._update_kl(b, mbs, logp_k)
        self.version = k + 1
        self.history[self.version] = self.weights()
        for v in [v for v in self.history if v < self.version - self.cfg.max_lag]:
            del self.history[v]
        return stats | {
            "loss": total / (n_kept or 1.0),
            "grad/norm": grad_norm,
            "lr": lr,
            "count/skipped_nonfinite": self.skipped_nonfinite,
            "learner/tokens": int(b.mask.sum()),
        }

    def _is_stats(self, b: Batch, mbs: list[list[int]], logp_k: Tensor, gate: Tensor
                  ) -> dict[str, float]:
        """D3 (total, mismatch, lag), peak/median weight, ESS, KL, lag, gate rejections."""
        mask = b.mask
        logw = logp_k - b.mu
        out = {
            "is/w_peak_over_median": peak_over_median(logw, mask),
            "is/ess_frac": ess_frac(torch.exp(sequence_log_ratio(logw, mask))[mask.sum(-1) > 0]),
            "kl/rollout_learner": kl_k2(logw, mask),
            "gate/rejected_frac": float((~gate).sum()) / len(gate),
        }
        gen = mask.bool()
        lags = (self.version - b.versions)[gen].double()
        out["lag/mean"] = float(lags.mean()) if lags.numel() else 0.0
        out["lag/max"] = float(lags.max()) if lags.numel() else 0.0
        if not self.cfg.track_mismatch:
            return out | {"is/d3": split_d3(logp_k, logp_k, b.mu, mask)["is/d3"]}
        logp_v, known, share = self._logprobs_at_versions(b, mbs, logp_k)
        split = split_d3(logp_k, logp_v, b.mu, mask * known)
        split["is/d3"] = split_d3(logp_k, logp_k, b.mu, mask)["is/d3"]
        split["is/d3_share"] = share
        return out | split

    def _forward_all(self, b: Batch, mbs: list[list[int]], label: str,
                     rows: set[int] | None = None) -> Tensor:
        """The current weights' logprobs of the batch (of its `rows` only, the rest 0),
        without gradients."""
        out = torch.zeros_like(b.mu)
        with self.clock.during(FORWARD), self.timeline.span(label, "learner_fwd"), \
                torch.no_grad():
            for idx in mbs:
                idx = idx if rows is None else [i for i in idx if i in rows]
                if idx:
                    out[idx] = self._logprobs(self.model, b, idx).double()
                else:
                    self._idle(train=False)
        return out

    def _sample(self, rows: list[int], share: float) -> set[int]:
        """`share` of `rows` (rounded up), drawn from this version's seed: the sampled
        extra forwards (D3 split, trust region) pick the same way on every run."""
        return set(random.Random(self.version).sample(rows, math.ceil(share * len(rows))))

    def _bound_update(self, b: Batch, mbs: list[list[int]], logp_k: Tensor,
                      before: list[Tensor]) -> dict[str, float]:
        """The trust region (optim.max_update_kl). A stale batch cannot see that the last
        updates took the policy over a cliff, and Adam's momentum carries it on
        (docs/benchmarks-async.md); so the update's KL is measured on a sample of its own
        batch (`update_kl_share`, drawn from the version's seed) and, above the bound,
        θ ← θ_k + r·(θ − θ_k) and Adam's m ← r·m with r = (bound / KL)^(1/a): a = 2 first
        (the KL is quadratic in the step near θ_k), then the exponent the last shrink
        measured (between 0.5 and 2), up to TRUST_TRIES shrinks until the sample's KL is
        within the bound: a step that went far is past the quadratic part, and one shrink
        by √(bound / KL) left it above the bound. `trust/scale` is the product of the
        shrinks, `kl/update_bounded` the sample's KL after them."""
        o = self.cfg.optim
        n = len(b.lengths)
        rows = self._sample(list(range(n)), o.update_kl_share)
        keep = torch.zeros(n, 1, dtype=b.mask.dtype)
        keep[sorted(rows)] = 1

        def sampled_kl() -> float:
            lp = self._forward_all(b, mbs, "update KL (trust region)", rows)
            return kl_k2(lp - logp_k, b.mask * keep)

        first = kl = sampled_kl()
        scale, exponent = 1.0, 2.0
        for _ in range(TRUST_TRIES):
            if not kl > o.max_update_kl:
                break
            r = (o.max_update_kl / kl) ** (1 / exponent)
            with torch.no_grad():
                for p, p0 in zip(self.model.parameters(), before, strict=True):
                    p.lerp_(p0, 1.0 - r)
                    if "exp_avg" in self._moments(p):
                        self._moments(p)["exp_avg"].mul_(r)
            scale *= r
            kl, last = sampled_kl(), kl
            if 0 < kl < last:
                exponent = min(2.0, max(0.5, math.log(last / kl) / -math.log(r)))
        return {"kl/update_sampled": first, "kl/update_bounded": kl, "trust/scale": scale}

    def _update_kl(self, b: Batch, mbs: list[list[int]], logp_k: Tensor) -> float:
        """k2 KL between the weights before and after this update, on the batch's tokens."""
        logp_next = self._forward_all(b, mbs, f"logprobs θ_{self.version + 1}")
        return kl_k2(logp_next - logp_k, b.mask)

    def _logprobs_at_versions(self, b: Batch, mbs: list[list[int]], logp_k: Tensor
                              ) -> tuple[Tensor, Tensor, float]:
        """Per token, the learner's logprob under the version that sampled it (θ_v on the
        learner's kernels), a mask of tokens whose version's weights are still kept, and
        the share of sequences with older tokens that were recomputed: each costs a forward
        per older version, so only `mismatch_share` of them (a sample drawn from the
        version's own seed) are; the mismatch is measured on those."""
        logp_v = logp_k.clone()  # v == k: the same forward, bit for bit
        known = (b.versions == self.version).to(b.mask.dtype)
        gen = b.mask.bool()
        older = [i for i in range(len(b.lengths)) if bool((b.versions[i][gen[i]] != self.version).any())]
        picked = self._sample(older, self.cfg.mismatch_share)
        share = len(picked) / len(older) if older else 1.0
        for v in sorted(set(b.versions[gen].tolist()) - {self.version}):
            if v not in self.history:
                continue  # older than max_lag (or lost on resume): left out of the split
            rows = [i for i in picked if bool((b.versions[i] == v).any())]
            if not rows:
                continue
            sel = (b.versions == v) & torch.isin(torch.arange(len(b.lengths)), torch.tensor(rows))[:, None]
            with self._at_version(v) as shadow, self.clock.during(D3_SPLIT), \
                    self.timeline.span(f"logprobs θ_{v}", "learner_fwd"), torch.no_grad():
                for idx in mbs:
                    idx = [i for i in idx if i in rows]
                    if idx:
                        lp = self._logprobs(shadow, b, idx)
                        logp_v[idx] = torch.where(sel[idx], lp, logp_v[idx])
                    else:
                        self._idle(train=False)
            known = torch.maximum(known, sel.to(known.dtype))
        return logp_v, known, share

    @contextmanager
    def _at_version(self, v: int) -> Iterator[nn.Module]:
        """A model computing with version `v`'s weights while the context lasts: a copy of
        the model that loads them."""
        if self._shadow is None:
            self._shadow = copy.deepcopy(self.model)
            self._shadow.requires_grad_(False)
        self._shadow.load_state_dict(self.history[v])
        self._shadow.train(self.model.training)
        yield self._shadow

    def state(self) -> dict[str, Any]:
        """Resumable learner state (the model itself is saved as safetensors)."""
        return {"version": self.version, "skipped_nonfinite": self.skipped_nonfinite,
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}}

    def load_state(self, state: dict[str, Any], optimizer: dict[str, Any] | Path) -> None:
        """Resume from `state` and AdamW's state: one learner's state dict, or the directory
        of a learner group's sharded checkpoint (`parity.trainer.checkpoint.load_optimizer`)."""
        self.version = state["version"]
        self.skipped_nonfinite = state["skipped_nonfinite"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if isinstance(optimizer, Path):
            load_optimizer(self.model, self.opt, optimizer)
        else:
            self._load_optimizer(optimizer)
        self.history = {self.version: self.weights()}

    def _load_optimizer(self, optimizer: dict[str, Any]) -> None:
        """One learner's AdamW state dict (a sharded learner takes its shards of it)."""
        self.opt.load_state_dict(optimizer)
