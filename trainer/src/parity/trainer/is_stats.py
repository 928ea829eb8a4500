"""Importance-sampling statistics over the generated tokens of a batch.

All functions take `logw` = log π − log μ per token and a 0/1 `mask` of the tokens that
count (the model-generated ones), both [B, T]; masked-out positions are ignored whatever
they hold. For the split of docs/training.md §1:

    total     logw = log π_θk − log μ_v
    mismatch  logw = log π_θv − log μ_v     (same weights, learner vs rollout kernels)
    lag       logw = log π_θk − log π_θv    (the weights moved)
"""

from __future__ import annotations

import torch
from torch import Tensor


def d3(logw: Tensor, mask: Tensor) -> float:
    """D3 = per-token mean of (w − 1 − log w), w = exp(logw); 0 iff every w is 1.

    (It is the k3 estimator of KL(μ‖π) for tokens sampled from μ.)"""
    n = mask.sum()
    if n == 0:
        return 0.0
    lw = logw.double() * mask
    return float(((torch.expm1(lw) - lw) * mask).sum() / n)


def kl_k2(logw: Tensor, mask: Tensor) -> float:
    """Rollout-to-learner KL, per-token mean of ½(log w)² (k2 estimator, ≥ 0)."""
    n = mask.sum()
    if n == 0:
        return 0.0
    return float((0.5 * (logw.double() * mask) ** 2).sum() / n)


def peak_over_median(logw: Tensor, mask: Tensor) -> float:
    """max(w) / median(w) over the counted tokens (1.0 when all weights are equal)."""
    w = torch.exp(logw.double()[mask.bool()])
    if w.numel() == 0:
        return 1.0
    return float(w.max() / w.median())


def sequence_log_ratio(logw: Tensor, mask: Tensor) -> Tensor:
    """Per response, the mean per-token log weight: log ρ_i = (1/|y_i|) Σ_t log w_{i,t}.

    ρ_i is the length-normalised sequence ratio used for ESS and the VCPO baseline (the raw
    product of token weights over thousands of tokens under- or overflows)."""
    n = mask.sum(-1).clamp_min(1)
    return (logw.double() * mask).sum(-1) / n


def ess_frac(rho: Tensor) -> float:
    """ESS / N with ESS = (Σρ)² / Σρ² over N samples; 1.0 when all ρ are equal."""
    rho = rho.double()
    if rho.numel() == 0:
        return 1.0
    return float(rho.sum() ** 2 / (rho.numel() * (rho**2).sum()))


def split_d3(logp_k: Tensor, logp_v: Tensor, mu: Tensor, mask: Tensor) -> dict[str, float]:
    """`is/d3`, `is/d3_mismatch`, `is/d3_lag` from the learner's logprobs under the current
    weights θ_k, under the rollout's version θ_v, and the rollout's recorded μ."""
    return {
        "is/d3": d3(logp_k - mu, mask),
        "is/d3_mismatch": d3(logp_v - mu, mask),
        "is/d3_lag": d3(logp_k - logp_v, mask),
    }
