"""parity.model.batch: trajectories packed for the model, their fields shifted onto the
logprob positions; `packed_logprobs` scores them with the same bits whatever the batch."""

from __future__ import annotations

import pytest
import torch

from parity.core.types import Trajectory
from parity.model import load_model, packed_logprobs, token_logprobs
from parity.model.batch import collate


def _traj(gid: str, tokens: list[int], start: int) -> Trajectory:
    n = len(tokens)
    return Trajectory(gid, tokens=tokens, loss_mask=[0] * start + [1] * (n - start),
                      logprobs=[0.0] * start + [-0.5] * (n - start),
                      versions=[-1] * start + [1] * (n - start))


def test_tokens_pack_and_fields_shift_onto_logprob_rows() -> None:
    a = Trajectory(
        "a", tokens=[5, 6, 7], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.25], versions=[-1, 3, 4]
    )
    b = Trajectory("b", tokens=[8, 9], loss_mask=[0, 1], logprobs=[0.0, -1.0], versions=[-1, 2])
    batch = collate([a, b])
    assert torch.equal(batch.tokens, torch.tensor([5, 6, 7, 8, 9]))
    assert torch.equal(batch.lengths, torch.tensor([3, 2]))
    assert batch.starts == [0, 3]
    assert torch.equal(batch.mask, torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    assert torch.equal(batch.mu, torch.tensor([[-0.5, -0.25], [-1.0, 0.0]], dtype=torch.float64))
    assert torch.equal(batch.versions, torch.tensor([[3, 4], [2, -1]]))
    tokens, lengths = batch.packed([1, 0])
    assert torch.equal(tokens, torch.tensor([8, 9, 5, 6, 7])) and lengths == [2, 3]
    lp = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)  # sequences 1, 0: 1 + 2 positions
    rows = batch.rows(lp, [1, 0])
    assert torch.equal(rows, torch.tensor([[-1.0, 0.0], [-2.0, -3.0]]))
    rows.sum().backward()
    assert torch.equal(lp.grad, torch.ones(3))


def test_refuses_a_generated_first_token_and_an_empty_batch() -> None:
    bad = Trajectory("g", tokens=[5, 6], loss_mask=[1, 1], logprobs=[0.0, 0.0], versions=[0, 0])
    with pytest.raises(ValueError, match="first token"):
        collate([bad])
    with pytest.raises(ValueError, match="empty batch"):
        collate([])


def test_a_sequence_scores_the_same_bits_in_any_micro_batch_and_chunking(qwen2_dir) -> None:
    """The learner's forward: a sequence's logprobs alone, packed among others in any order,
    and in chunks (one of a single last token among them) are one set of bits; the padded
    `token_logprobs` is their rows."""
    model = load_model(qwen2_dir)
    g = torch.Generator().manual_seed(0)
    b = collate([_traj(str(i), torch.randint(0, 97, (n,), generator=g).tolist(), 3)
                 for i, n in enumerate([17, 40, 5, 33])])
    with torch.no_grad():
        alone = [packed_logprobs(model, *b.packed([i])) for i in range(4)]
        for idx in ([0, 1, 2, 3], [3, 1], [2, 0, 3]):
            rows = b.rows(packed_logprobs(model, *b.packed(idx)), idx)
            for r, i in enumerate(idx):
                assert torch.equal(rows[r, : len(alone[i])], alone[i])
        chunked = packed_logprobs(model, *b.packed(range(4)), chunk_size=16)
        assert torch.equal(chunked, torch.cat(alone))  # 17 and 33 tokens: a last chunk of one
        padded = torch.zeros(4, 40, dtype=torch.long)
        for i in range(4):
            padded[i, : b.lengths[i]] = b.packed([i])[0]
        assert torch.equal(token_logprobs(model, padded, lengths=b.lengths), b.rows(torch.cat(alone)))
    packed_logprobs(model, *b.packed([0]), chunk_size=16).sum().backward()  # trains in chunks
