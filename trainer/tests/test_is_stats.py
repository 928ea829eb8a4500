"""D3, ESS, KL and the mismatch/lag split against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.trainer.is_stats import (
    d3,
    ess_frac,
    kl_k2,
    peak_over_median,
    sequence_log_ratio,
    split_d3,
)


def test_d3_by_hand_and_masking() -> None:
    logw = torch.tensor([[math.log(2.0), 0.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert d3(logw, mask) == pytest.approx((2 - 1 - math.log(2)) / 2)
    assert d3(torch.zeros(2, 3), torch.ones(2, 3)) == 0.0
    assert d3(logw, torch.zeros(1, 3)) == 0.0


def test_kl_and_peak_over_median() -> None:
    logw = torch.tensor([[math.log(4.0), 0.0, 0.0, math.log(0.5)]])
    mask = torch.ones(1, 4)
    assert kl_k2(logw, mask) == pytest.approx(0.5 * (math.log(4) ** 2 + math.log(0.5) ** 2) / 4)
    # weights 4, 1, 1, 0.5: torch's median is the lower middle value, 1
    assert peak_over_median(logw, mask) == pytest.approx(4.0)


def test_ess_frac() -> None:
    assert ess_frac(torch.ones(5)) == pytest.approx(1.0)
    # ρ = [1, 0, 0, 0]: ESS = 1 -> 1/4
    assert ess_frac(torch.tensor([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)
    # ρ = [2, 1]: (3)²/(5) = 1.8 -> 0.9
    assert ess_frac(torch.tensor([2.0, 1.0])) == pytest.approx(0.9)


def test_sequence_log_ratio_is_token_mean() -> None:
    logw = torch.tensor([[1.0, 3.0, 50.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(sequence_log_ratio(logw, mask),
                               torch.tensor([2.0, 0.0], dtype=torch.float64))


def test_split_d3_mismatch_zero_when_versions_agree() -> None:
    mu = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    lag_only = split_d3(logp_k=mu + 0.1, logp_v=mu, mu=mu, mask=mask)
    assert lag_only["is/d3_mismatch"] == 0.0
    assert lag_only["is/d3_lag"] == lag_only["is/d3"] > 0
    mism = split_d3(logp_k=mu + 0.1, logp_v=mu + 0.1, mu=mu, mask=mask)
    assert mism["is/d3_lag"] == 0.0
    assert mism["is/d3_mismatch"] == mism["is/d3"] == pytest.approx(math.exp(0.1) - 1.1)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=20))
def test_d3_nonnegative_and_ess_in_unit_interval(xs: list[float]) -> None:
    logw = torch.tensor([xs], dtype=torch.float64)
    mask = torch.ones_like(logw)
    assert d3(logw, mask) >= 0.0
    assert 0.0 < ess_frac(torch.exp(logw[0])) <= 1.0 + 1e-12
