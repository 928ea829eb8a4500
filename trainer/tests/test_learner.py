"""The learner: D3 split across versions, gradient accumulation, NaN skip, VCPO LR."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from tiny import TinyLM, make_group, packed_logprobs

from parity.core.types import Trajectory
from parity.trainer.config import TrainConfig
from parity.trainer.learner import Learner, LearnerSettings, collate, micro_batches

SEQS_A = [[1, 2, 3, 4, 5], [1, 2, 6, 7]]
SEQS_B = [[3, 3, 4], [3, 5, 5, 5, 5, 6]]


def _cfg(**sections) -> LearnerSettings:
    base = {"optim": {"lr": 1e-2}, "train": {"max_lag": 2}}
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    return LearnerSettings.of(TrainConfig.model_validate(base))


def _groups(model, version: int, noise: float = 0.0) -> list[list[Trajectory]]:
    return [make_group(model, "a", SEQS_A, 2, [1.0, 0.0], version, noise),
            make_group(model, "b", SEQS_B, 1, [0.0, 1.0], version, noise)]


def test_collate_aligns_mu_mask_versions_to_logprob_positions() -> None:
    t = Trajectory("g", tokens=[5, 6, 7], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.25],
                   versions=[-1, 3, 4], reward=1.0)
    b = collate([[t]])
    assert b.mu.tolist() == [[-0.5, -0.25]]
    assert b.mask.tolist() == [[1.0, 1.0]]
    assert b.versions.tolist() == [[3, 4]]
    bad = Trajectory("g", tokens=[5, 6], loss_mask=[1, 1], logprobs=[0.0, 0.0], versions=[0, 0])
    with pytest.raises(ValueError, match="first token"):
        collate([[bad]])


def test_the_learner_leaves_the_global_rng_to_its_caller() -> None:
    model = TinyLM()
    before = torch.get_rng_state()
    Learner(_cfg(), model, packed_logprobs)
    assert torch.equal(torch.get_rng_state(), before)


def test_micro_batches_respect_token_budget() -> None:
    assert micro_batches(torch.tensor([4, 4, 4, 10, 2]), 8) == [[0, 1], [2], [3], [4]]
    assert micro_batches(torch.tensor([4, 4, 4]), 100) == [[0, 1, 2]]
    # real tokens, not count × longest: 2 + 6 fits 8 (padded it would take 12)
    assert micro_batches(torch.tensor([2, 6, 3]), 8) == [[0, 1], [2]]


def test_publishing_hands_out_the_kept_weights_which_stay_that_version() -> None:
    """`current_weights` is the history's copy of the current version (no second copy), and
    the next update replaces it in the history without touching the published one."""
    model = TinyLM()
    learner = Learner(_cfg(), model, packed_logprobs)
    learner.train_step(_groups(model, 0))
    published = learner.current_weights()
    assert published is learner.history[1]
    kept = {k: v.clone() for k, v in published.items()}
    assert all(torch.equal(v, learner.weights()[k]) for k, v in kept.items())
    learner.train_step(_groups(model, 1))
    assert all(torch.equal(published[k], v) for k, v in kept.items())
    assert any(not torch.equal(learner.current_weights()[k], v) for k, v in kept.items())


def test_d3_splits_into_mismatch_and_lag() -> None:
    model = TinyLM()
    # every sequence split (the default samples a quarter): is/d3 is then mismatch plus lag
    learner = Learner(_cfg(train={"mismatch_share": 1.0}), model, packed_logprobs)
    g0 = _groups(model, version=0)  # μ = π_θ0 exactly: aligned sampling at version 0
    m0 = learner.train_step(g0)
    assert m0["is/d3"] == m0["is/d3_mismatch"] == m0["is/d3_lag"] == 0.0
    assert m0["is/ess_frac"] == 1.0 and m0["lag/max"] == 0.0
    m1 = learner.train_step(g0)  # the same rollouts one version later: lag only
    assert m1["lag/mean"] == 1.0
    assert m1["is/d3_mismatch"] == 0.0
    assert m1["is/d3_lag"] > 0 and m1["is/d3"] == m1["is/d3_lag"]
    noisy = _groups(learner.model, version=2, noise=0.05)  # same version, different "kernels"
    m2 = learner.train_step(noisy)
    assert m2["is/d3_lag"] == 0.0
    assert m2["is/d3_mismatch"] == pytest.approx(math.exp(-0.05) - 1 + 0.05)


def test_async_defaults_to_a_trust_region_and_zero_turns_it_off() -> None:
    def settings(**sections) -> LearnerSettings:
        return LearnerSettings.of(TrainConfig.model_validate(sections))

    def bound(**train) -> float | None:
        return settings(train=train).optim.max_update_kl

    assert bound(mode="sync") == 0.0
    assert bound(mode="async", max_lag=0) == 0.0  # lag 0 is sync
    assert bound(mode="async", max_lag=2) == 0.1
    assert settings(optim={"max_update_kl": 0}).optim.max_update_kl == 0.0
    assert settings(optim={"max_update_kl": 0.3}, train={"mode": "sync"}).optim.max_update_kl == 0.3
    assert settings().optim.betas == (0.9, 0.999)
    model = TinyLM()
    for optim, bounded in (({}, True), ({"max_update_kl": 0}, False)):
        m = Learner(_cfg(optim=optim), model, packed_logprobs).train_step(_groups(model, 0))
        assert ("trust/scale" in m) is bounded


def test_update_kl_is_how_far_the_update_moved_the_policy_on_its_batch() -> None:
    """kl/update after an update on rollouts with μ = π_θ0 is the KL that the next step on
    the same rollouts measures between them and the learner: both are k2(π_θ1 − π_θ0)."""
    model = TinyLM()
    learner = Learner(_cfg(train={"track_update_kl": True}), model, packed_logprobs)
    g0 = _groups(model, version=0)
    m0 = learner.train_step(g0)
    m1 = learner.train_step(g0)
    assert m0["kl/rollout_learner"] == 0.0
    assert m0["kl/update"] > 0 and m0["kl/update"] == m1["kl/rollout_learner"]
    assert "kl/update" not in Learner(_cfg(), TinyLM(), packed_logprobs).train_step(g0)


def _bounded_run(**optim) -> tuple[Learner, dict[str, float]]:
    torch.manual_seed(0)
    model = TinyLM()
    learner = Learner(_cfg(optim=optim), model, packed_logprobs)
    return learner, learner.train_step(_groups(model, version=0))


def _assert_shrunk(free: Learner, bounded: Learner, s: float) -> None:
    """`bounded`'s weights are θ0 + s·(θ − θ0) of `free`'s step and its momentum s times
    the free one's (second moments untouched)."""
    torch.manual_seed(0)
    theta0 = list(TinyLM().parameters())
    for p0, p, q in zip(theta0, free.model.parameters(), bounded.model.parameters(), strict=True):
        torch.testing.assert_close(q, p0 + s * (p - p0), rtol=0, atol=3e-7)  # a few lerps
        torch.testing.assert_close(bounded.opt.state[q]["exp_avg"], s * free.opt.state[p]["exp_avg"],
                                   rtol=1e-6, atol=0)
        assert torch.equal(bounded.opt.state[q]["exp_avg_sq"], free.opt.state[p]["exp_avg_sq"])


def test_the_trust_region_shrinks_a_large_update_and_its_momentum() -> None:
    """Above optim.max_update_kl the bounded step is θ0 + s·(θ − θ0) of the free step and
    Adam's momentum s times the free one, s about √(bound / KL) with KL the free update's on
    the sample, and the sample's KL after it within the bound; under it (or at 0) the step
    is the free one, bit for bit."""
    free, _ = _bounded_run(max_update_kl=0)
    loose, m_loose = _bounded_run(max_update_kl=1e6)
    assert m_loose["trust/scale"] == 1.0 and m_loose["kl/update_sampled"] > 0
    assert m_loose["kl/update_bounded"] == m_loose["kl/update_sampled"]
    for p, q in zip(free.model.parameters(), loose.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert "trust/scale" not in _bounded_run(max_update_kl=0)[1]

    bound = m_loose["kl/update_sampled"] / 16  # the same sample, the same free step
    tight, m = _bounded_run(max_update_kl=bound)
    assert m["kl/update_sampled"] == m_loose["kl/update_sampled"]
    assert m["kl/update_bounded"] <= bound and 0.2 < m["trust/scale"] <= 0.25
    _assert_shrunk(free, tight, m["trust/scale"])


def test_the_trust_region_shrinks_a_far_step_until_the_sample_is_within_the_bound() -> None:
    """A step that moved the policy far (lr 1.0) is past where the KL is quadratic in it: one
    shrink by √(bound / KL) leaves the sample's KL above the bound, so it is measured and
    shrunk again until it is within (as one shrink alone, the region let it through)."""
    free, m_free = _bounded_run(max_update_kl=1e6, lr=1.0)
    bound = 0.05
    assert m_free["kl/update_sampled"] > 10 * bound
    far, m = _bounded_run(max_update_kl=bound, lr=1.0)
    assert m["kl/update_sampled"] == m_free["kl/update_sampled"]
    assert m["kl/update_bounded"] <= bound
    assert m["trust/scale"] < (bound / m["kl/update_sampled"]) ** 0.5
    _assert_shrunk(free, far, m["trust/scale"])


def test_the_split_recomputes_a_sampled_share_of_older_sequences() -> None:
    """At share 0.5, two of the four sequences sampled one version back are recomputed
    under it (one forward of half the batch), and is/d3_share says so; the mismatch is still
    measured (0 here: μ is the model's own logprob) and is/d3 still covers every token."""
    model = TinyLM()
    full = Learner(_cfg(train={"mismatch_share": 1.0}), copy.deepcopy(model), packed_logprobs)
    half = Learner(_cfg(train={"mismatch_share": 0.5}), model, packed_logprobs)
    g0 = _groups(model, version=0)
    for learner in (full, half):
        learner.train_step(g0)
    m_full, m_half = full.train_step(g0), half.train_step(g0)
    assert m_full["is/d3_share"] == 1.0 and m_half["is/d3_share"] == 0.5
    assert m_half["is/d3_mismatch"] == 0.0 and m_half["is/d3_lag"] > 0
    assert m_half["is/d3"] == m_full["is/d3"]


def test_versions_older_than_max_lag_leave_the_split() -> None:
    model = TinyLM()
    learner = Learner(_cfg(train={"max_lag": 0}), model, packed_logprobs)
    g0 = _groups(model, version=0, noise=0.05)
    learner.train_step(g0)
    m = learner.train_step(g0)  # version 0 weights are gone (max_lag 0)
    assert m["is/d3_mismatch"] == 0.0 and m["is/d3_lag"] == 0.0
    assert m["is/d3"] > 0


def test_gradient_accumulation_matches_one_batch() -> None:
    a, b = TinyLM(), TinyLM()
    la = Learner(_cfg(optim={"micro_batch_tokens": 1}), a, packed_logprobs)
    lb = Learner(_cfg(optim={"micro_batch_tokens": 10_000}), b, packed_logprobs)
    ma, mb = la.train_step(_groups(a, 0)), lb.train_step(_groups(b, 0))
    assert ma["grad/norm"] == pytest.approx(mb["grad/norm"], rel=1e-6)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-7)


def test_nonfinite_loss_skips_update_and_counts() -> None:
    model = TinyLM()
    learner = Learner(_cfg(), model, packed_logprobs)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    groups = _groups(model, 0)
    groups[0][0].reward = float("nan")
    m = learner.train_step(groups)
    assert m["count/skipped_nonfinite"] == 1
    assert learner.version == 1  # the batch is consumed, the weights are unchanged
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_vcpo_lr_is_scaled_by_ess() -> None:
    model = TinyLM()
    learner = Learner(_cfg(loss={"vcpo_lr": "linear", "vcpo_baseline": True}), model,
                      packed_logprobs)
    groups = _groups(model, 0)
    groups[0][0].logprobs = [x - 0.5 if m else 0.0 for x, m in
                             zip(groups[0][0].logprobs, groups[0][0].loss_mask, strict=True)]
    m = learner.train_step(groups)
    assert m["is/ess_frac"] < 1.0
    assert m["lr"] == pytest.approx(1e-2 * m["is/ess_frac"])


def _segmented(t: Trajectory, copies: int) -> Trajectory:
    """`t` as an episode of `copies` segments, each `t`'s sequence."""
    return dataclasses.replace(t, earlier=[dataclasses.replace(t) for _ in range(copies - 1)])


def test_collate_gives_every_segment_a_row_weighted_by_its_episode() -> None:
    model = TinyLM()
    a, b = make_group(model, "a", SEQS_A, 2, [1.0, 0.0], 0)[:2]
    batch = collate([[_segmented(a, 3), b]])
    assert batch.lengths.tolist() == [len(a.tokens)] * 3 + [len(b.tokens)]
    assert batch.rewards.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert batch.groups.tolist() == [0, 0, 0, 0]
    assert batch.weights.tolist() == [1 / 3, 1 / 3, 1 / 3, 1.0]
    assert batch.firsts.tolist() == [True, False, False, True]


def test_an_episode_of_two_equal_segments_trains_as_one_of_that_sequence() -> None:
    """Two copies of a sequence at 1/2 each are that sequence once: the same advantages,
    the same N, the same loss up to the order of its sum (halving is exact, but the extra
    row changes how the reduction pairs its terms: equal bits on an Intel Xeon, one ulp of
    float64 apart on an AMD EPYC Zen 4)."""
    model = TinyLM()
    groups = _groups(model, 0)
    split = [[_segmented(groups[0][0], 2), *groups[0][1:]], groups[1]]
    one = Learner(_cfg(), copy.deepcopy(model), packed_logprobs).train_step(groups)
    two = Learner(_cfg(), copy.deepcopy(model), packed_logprobs).train_step(split)
    assert two["loss"] == pytest.approx(one["loss"], rel=4 * 2.0**-52, abs=0)
    assert two["learner/tokens"] == one["learner/tokens"] + int(groups[0][0].loss_mask.sum())
