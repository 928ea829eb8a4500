"""parity.model.batch: trajectories padded and shifted onto the logprob positions."""

from __future__ import annotations

import pytest
import torch

from parity.core.types import Trajectory
from parity.model.batch import collate


def test_fields_shift_onto_logprob_positions_and_pad() -> None:
    a = Trajectory(
        "a", tokens=[5, 6, 7], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.25], versions=[-1, 3, 4]
    )
    b = Trajectory("b", tokens=[8, 9], loss_mask=[0, 1], logprobs=[0.0, -1.0], versions=[-1, 2])
    batch = collate([a, b])
    assert torch.equal(batch.tokens, torch.tensor([[5, 6, 7], [8, 9, 0]]))
    assert torch.equal(batch.lengths, torch.tensor([3, 2]))
    assert torch.equal(batch.mask, torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    assert torch.equal(batch.mu, torch.tensor([[-0.5, -0.25], [-1.0, 0.0]], dtype=torch.float64))
    assert torch.equal(batch.versions, torch.tensor([[3, 4], [2, -1]]))


def test_refuses_a_generated_first_token_and_an_empty_batch() -> None:
    bad = Trajectory("g", tokens=[5, 6], loss_mask=[1, 1], logprobs=[0.0, 0.0], versions=[0, 0])
    with pytest.raises(ValueError, match="first token"):
        collate([bad])
    with pytest.raises(ValueError, match="empty batch"):
        collate([])
