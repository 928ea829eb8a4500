"""The loss, its modes and the VCPO formulas against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.trainer.config import LossSection
from parity.trainer.loss import (
    group_advantages,
    lr_at,
    reinforce_zero_loss,
    vcpo_lr_scale,
)

LN2 = math.log(2.0)


def _batch(shift: float = 0.0):
    """Two responses of one group. Response 0 generated positions 0,1; response 1 positions
    1,2. μ equals π except at (0,0) where log μ = log π − shift (w = e^shift)."""
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]], dtype=torch.float64,
                        requires_grad=True)
    mu = logp.detach().clone()
    mu[0, 0] -= shift
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]], dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0])
    groups = torch.tensor([0, 0])
    return logp, mu, mask, rewards, groups


def _loss(logp, mu, mask, rewards, groups, cfg: LossSection) -> tuple[torch.Tensor, torch.Tensor]:
    """L on one batch, normalised by its kept responses as the learner does; and the gate."""
    total, gate = reinforce_zero_loss(logp, mu, mask, group_advantages(rewards, groups, cfg), cfg)
    return total / int((gate & (mask.sum(-1) > 0)).sum()), gate


def _grad(cfg: LossSection, shift: float = 0.0) -> tuple[float, torch.Tensor]:
    logp, mu, mask, rewards, groups = _batch(shift)
    loss, _ = _loss(logp, mu, mask, rewards, groups, cfg)
    loss.backward()
    return float(loss.detach()), logp.grad


def test_on_policy_loss_and_gradient_by_hand() -> None:
    # A = [0.5, -0.5]; L = −½[(0.5(−1−2))/2 + (−0.5(−1.5−2.5))/2] = −½[−0.75 + 1.0] = −0.125
    loss, g = _grad(LossSection())
    assert loss == pytest.approx(-0.125)
    expected = torch.tensor([[-0.125, -0.125, 0.0], [0.0, 0.125, 0.125]], dtype=torch.float64)
    torch.testing.assert_close(g, expected)


def test_untruncated_token_weight_scales_its_token_only() -> None:
    _, g = _grad(LossSection(), shift=LN2)  # w(0,0) = 2
    assert g[0, 0] == pytest.approx(-0.25)
    assert g[0, 1] == pytest.approx(-0.125)
    assert g[1, 1] == pytest.approx(0.125)


def test_tis_truncates_at_c() -> None:
    _, g = _grad(LossSection(is_mode="tis", tis_c=1.5), shift=LN2)
    assert g[0, 0] == pytest.approx(-0.125 * 1.5)


def test_icepop_masks_tokens_outside_band_but_keeps_length() -> None:
    _, g = _grad(LossSection(is_mode="icepop", icepop_lo=0.5, icepop_hi=1.5), shift=LN2)
    assert g[0, 0] == 0.0
    assert g[0, 1] == pytest.approx(-0.125)  # |y_0| still 2


def test_no_is_ignores_the_weight() -> None:
    _, g = _grad(LossSection(is_mode="none"), shift=LN2)
    assert g[0, 0] == pytest.approx(-0.125)


def test_sequence_gate_drops_high_kl_sequence_and_counts_it() -> None:
    logp, mu, mask, rewards, groups = _batch(shift=LN2)
    # D3 of response 0 = ((2 − 1 − ln 2) + 0) / 2 = 0.1534...
    cfg = LossSection(gate_kl=0.1)
    loss, gate = _loss(logp, mu, mask, rewards, groups, cfg)
    loss.backward()
    assert gate.tolist() == [False, True]
    # only response 1 remains, N = 1: L = 0.5·(−1.5−2.5)/2 ... gradient +0.25 per token
    assert logp.grad[0].abs().sum() == 0.0
    assert logp.grad[1, 1] == pytest.approx(0.25)
    _, gate2 = _loss(logp, mu, mask, rewards, groups, LossSection(gate_kl=0.2))
    assert gate2.tolist() == [True, True]


def test_group_mean_and_grpo_advantages() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    a = group_advantages(r, g, LossSection())
    torch.testing.assert_close(a, torch.tensor([0.75, -0.25, -0.25, -0.25, 1.0, -1.0],
                                               dtype=torch.float64))
    a = group_advantages(r, g, LossSection(advantage="mean_std", std_eps=1e-12))
    std0 = math.sqrt(0.1875)  # population std of [1, 0, 0, 0]
    assert float(a[0]) == pytest.approx(0.75 / std0)
    assert float(a[4]) == pytest.approx(1.0)


def test_vcpo_min_variance_baseline() -> None:
    r = torch.tensor([1.0, 0.0, 0.0])
    g = torch.tensor([0, 0, 0])
    log_rho = torch.log(torch.tensor([2.0, 1.0, 1.0]))
    a = group_advantages(r, g, LossSection(vcpo_baseline=True), log_rho)
    # b* = (2·1 + 0 + 0) / (2 + 1 + 1) = 0.5
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, -0.5], dtype=torch.float64))
    a_off = group_advantages(r, g, LossSection(vcpo_baseline=False), log_rho)
    assert float(a_off[0]) == pytest.approx(2 / 3)


def test_vcpo_lr_scale_rules() -> None:
    assert vcpo_lr_scale(0.25, "linear") == 0.25
    assert vcpo_lr_scale(0.25, "sqrt") == 0.5
    assert vcpo_lr_scale(0.25, "off") == 1.0


def test_lr_schedules() -> None:
    assert lr_at(0, 10, 1.0, "constant", 2, 0.0) == 0.5
    assert lr_at(1, 10, 1.0, "constant", 2, 0.0) == 1.0
    assert lr_at(5, 10, 1.0, "constant", 0, 0.0) == 1.0
    assert lr_at(5, 10, 1.0, "linear", 0, 0.0) == pytest.approx(0.5)
    assert lr_at(5, 10, 1.0, "cosine", 0, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_at(10, 10, 1.0, "cosine", 0, 0.1) == pytest.approx(0.1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=2, max_size=8), st.integers(1, 5))
def test_group_mean_advantages_sum_to_zero(rewards: list[float], n_groups: int) -> None:
    r = torch.tensor(rewards, dtype=torch.float64)
    g = torch.arange(len(rewards)) % n_groups
    a = group_advantages(r, g, LossSection())
    for k in torch.unique(g):
        assert abs(float(a[g == k].sum())) < 1e-9


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(2, 6), st.integers(0, 10_000))
def test_micro_batch_accumulation_equals_full_batch(b: int, t: int, seed: int) -> None:
    """Summing the loss over any split, divided by the global N, gives the full-batch
    gradient (what the learner's gradient accumulation relies on)."""
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(2 * b, t, generator=gen, dtype=torch.float64)
    mu = logp - 0.3 * torch.randn(2 * b, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(2 * b, t, generator=gen) > 0.3).double()
    rewards = torch.randint(0, 2, (2 * b,), generator=gen).double()
    groups = torch.arange(2 * b) // 2
    cfg = LossSection()
    adv = group_advantages(rewards, groups, cfg)
    n = max(int((mask.sum(-1) > 0).sum()), 1)
    full = logp.clone().requires_grad_(True)
    (reinforce_zero_loss(full, mu, mask, adv, cfg)[0] / n).backward()
    acc = logp.clone().requires_grad_(True)
    for i in range(2 * b):  # one response per micro-batch
        part = slice(i, i + 1)
        (reinforce_zero_loss(acc[part], mu[part], mask[part], adv[part], cfg)[0] / n).backward()
    torch.testing.assert_close(acc.grad, full.grad)


def test_a_segmented_episode_counts_once_in_its_groups_baseline() -> None:
    # episode 0 has two segments (rows 0 and 1, both its reward 1), episode 1 one (reward 0)
    rewards, groups = torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0, 0, 0])
    counted = torch.tensor([True, False, True])
    assert group_advantages(rewards, groups, LossSection(), counted=counted).tolist() == [0.5, 0.5, -0.5]
    cfg = LossSection(advantage="mean_std")
    a = 0.5 / (0.5 + cfg.std_eps)  # the population std of the episodes' rewards [1, 0]
    assert group_advantages(rewards, groups, cfg, counted=counted).tolist() == [a, a, -a]
    # counted per row, the baseline would lean to the episode of more segments
    assert group_advantages(rewards, groups, LossSection()).tolist() != [0.5, 0.5, -0.5]
