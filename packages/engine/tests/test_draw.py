"""The sampler's inverse-CDF draw in C (csrc/draw.c): the rule of the torch draw, one row at
a time."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.engine.sampler import _c_draw, _draw, draw_logprobs, uniforms

pytestmark = pytest.mark.skipif(_c_draw() is None, reason="no C compiler")


def test_the_first_token_whose_running_sum_passes_u_times_the_total():
    # 40 tokens (two 16-lane vectors and a scalar tail), masses 1, 2, 3, ... on the even ones
    mass = torch.tensor([float(i // 2 + 1) if i % 2 == 0 else 0.0 for i in range(40)])
    lp = torch.log(mass / mass.sum()).unsqueeze(0)  # odd tokens: -inf
    total = mass.sum().item()  # 210
    for u, want in ((0.0, 0), (0.5 / total, 0), (1.5 / total, 2), (3.5 / total, 4),
                    (0.9999, 38), (100.0 / total, 26)):
        assert draw_logprobs(lp, torch.tensor([u], dtype=torch.float64)).item() == want


def test_it_draws_what_the_torch_draw_draws():
    g = torch.Generator().manual_seed(0)
    for trial, vocab in enumerate((151936, 1024, 17, 3000, 5)):
        lp = torch.log_softmax(torch.randn(8, vocab, generator=g) * (1 + trial), -1)
        lp[:, ::7] = -math.inf
        for s in range(40):
            u = uniforms(list(range(8)), [s * 7 + trial] * 8)
            assert torch.equal(draw_logprobs(lp, u), _draw(lp.exp(), u))


@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(1, 2100), masked=st.floats(0, 0.9), scale=st.floats(0.1, 30),
       u=st.floats(0, 1, exclude_max=True), seed=st.integers(0, 2**31))
def test_a_masked_token_is_never_drawn_and_a_larger_u_never_draws_an_earlier_token(
        vocab, masked, scale, u, seed):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(1, vocab, generator=g) * scale, -1)
    off = torch.rand(vocab, generator=g) < masked
    off[torch.randint(vocab, (1,), generator=g)] = False  # at least one token has mass
    lp[0, off] = -math.inf
    lo = draw_logprobs(lp, torch.tensor([u], dtype=torch.float64)).item()
    hi = draw_logprobs(lp, torch.tensor([(1 + u) / 2], dtype=torch.float64)).item()
    assert not off[lo] and not off[hi] and lo <= hi


def test_a_row_draws_the_same_token_alone_and_among_others():
    g = torch.Generator().manual_seed(3)
    lp = torch.log_softmax(torch.randn(6, 5000, generator=g) * 4, -1)
    u = uniforms([11] * 6, list(range(6)))
    together = draw_logprobs(lp, u)
    assert [draw_logprobs(lp[i:i + 1], u[i:i + 1]).item() for i in range(6)] == together.tolist()
