"""REINFORCE Zero (docs/training.md §2) and its comparison modes.

    A_i     = R_i − b_g                       b_g: group mean (or VCPO's Σρ_i R_i / Σρ_i)
    w_{i,t} = exp(log π_θ − log μ)            untruncated by default
    L       = −(1/N) Σ_i (1/|y_i|) Σ_t sg(w_{i,t}) · A_i · log π_θ(y_{i,t})

N counts the responses kept (the sequence gate may drop some); |y_i| counts generated
tokens only. `response_losses` returns the per-response terms so gradient accumulation
over micro-batches sums them and divides by the batch-wide N, giving exactly the
full-batch gradient.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from parity.trainer.config import LossSection
from parity.trainer.is_stats import d3


def group_advantages(rewards: Tensor, groups: Tensor, cfg: LossSection,
                     log_rho: Tensor | None = None, counted: Tensor | None = None) -> Tensor:
    """Advantage per response. `groups[i]` is the group index of response i.

    mean: A = R − mean_g R.  mean_std (GRPO): A = (R − mean_g R) / (std_g R + eps), std
    the population std. With `cfg.vcpo_baseline` and `log_rho` (log ρ_i per response) the
    baseline is b* = Σ_g ρ_i R_i / Σ_g ρ_i instead of the mean. `counted` (default: all):
    the responses the mean and std are taken over, one per episode when an episode has
    several sequences (segments) that share its reward."""
    rewards = rewards.double()
    counted = torch.ones_like(groups, dtype=torch.bool) if counted is None else counted
    adv = torch.empty_like(rewards)
    for g in torch.unique(groups):
        idx = groups == g
        r, once = rewards[idx], rewards[idx & counted]
        if cfg.vcpo_baseline and log_rho is not None:
            rho = torch.exp(log_rho[idx].double() - log_rho[idx].double().max())  # scale-free
            base = (rho * r).sum() / rho.sum()
        else:
            base = once.mean()
        a = r - base
        if cfg.advantage == "mean_std":
            a = a / (once.std(unbiased=False) + cfg.std_eps)
        adv[idx] = a
    return adv


def token_weights(logw: Tensor, cfg: LossSection) -> Tensor:
    """The detached per-token IS weight of the chosen mode. IcePop zeroes the weight of
    tokens outside its band (they still count in |y_i|)."""
    logw = logw.detach()
    if cfg.is_mode == "none":
        return torch.ones_like(logw)
    w = torch.exp(logw)
    if cfg.is_mode == "tis":
        return w.clamp(max=cfg.tis_c)
    if cfg.is_mode == "icepop":
        return w * ((w >= cfg.icepop_lo) & (w <= cfg.icepop_hi)).to(w.dtype)
    return w


def gate_keep(logw: Tensor, mask: Tensor, cfg: LossSection) -> Tensor:
    """Sequence gate: True for responses whose mean per-token KL (D3) is ≤ δ (all True when
    the gate is off)."""
    keep = torch.ones(logw.shape[0], dtype=torch.bool, device=logw.device)
    if cfg.gate_kl is None:
        return keep
    for i in range(logw.shape[0]):
        keep[i] = d3(logw[i : i + 1].detach(), mask[i : i + 1]) <= cfg.gate_kl
    return keep


def response_losses(logp: Tensor, w: Tensor, mask: Tensor, adv: Tensor) -> Tensor:
    """Per response, −(1/|y_i|) Σ_t w · A_i · log π (|y_i| from `mask`; 0 for empty ones)."""
    n = mask.sum(-1)
    per = -(w * mask * logp).sum(-1) * adv.to(logp.dtype)
    return torch.where(n > 0, per / n.clamp_min(1), torch.zeros_like(per))


def reinforce_zero_loss(logp: Tensor, mu: Tensor, mask: Tensor, adv: Tensor,
                        cfg: LossSection) -> tuple[Tensor, Tensor]:
    """The loss of responses [B, T] with advantages `adv` [B] (from the whole batch's
    groups): (Σ_i over kept responses of their terms, the sequence gate [B]). The learner
    sums it over micro-batches and divides by the batch-wide N kept, which is L exactly."""
    logw = logp.detach() - mu
    gate = gate_keep(logw, mask, cfg)
    keep = gate & (mask.sum(-1) > 0)
    return (response_losses(logp, token_weights(logw, cfg), mask, adv) * keep).sum(), gate


def vcpo_lr_scale(ess_frac: float, rule: str) -> float:
    """η/η0 under VCPO: ESS/N (linear, the paper), sqrt(ESS/N) (released code), 1 (off)."""
    if rule == "linear":
        return ess_frac
    if rule == "sqrt":
        return math.sqrt(ess_frac)
    return 1.0


def lr_at(step: int, total: int, base: float, schedule: str, warmup: int,
          min_ratio: float) -> float:
    """The scheduled LR for update `step` (0-based) of `total`: linear warmup, then
    constant / linear decay / cosine decay to base·min_ratio."""
    if warmup and step < warmup:
        return base * (step + 1) / warmup
    if schedule == "constant":
        return base
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    f = 1.0 - frac if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))
    return base * (min_ratio + (1.0 - min_ratio) * f)
