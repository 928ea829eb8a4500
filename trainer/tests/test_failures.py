"""Episodes that failed outside the agent: out of their group's baseline and of the loss,
their group dropped when too few remain, counted by kind (no Ray: the orchestrator's run is
in test_orchestrator.py)."""

from __future__ import annotations

import dataclasses

import torch
from tiny import TinyLM, make_group, packed_logprobs

from parity.core.types import Trajectory
from parity.trainer.commands import _print_summary
from parity.trainer.config import TrainConfig
from parity.trainer.failures import describe, failure_metrics, too_few_left, usable
from parity.trainer.learner import Learner, LearnerSettings, collate
from parity.trainer.loss import group_advantages
from parity.trainer.rundir import summarize

SEQS = [[1, 2, 3, 4, 5], [1, 2, 6, 7], [1, 2, 5, 5, 9], [1, 2, 8]]
CFG = TrainConfig.model_validate({"optim": {"lr": 1e-2}, "train": {"max_lag": 2}})


def _group(model: TinyLM, failed_reward: float = 0.0, failed_seq: list[int] | None = None
           ) -> list[Trajectory]:
    """Four episodes scoring 1, 0, ·, 1; the third failed (its sandbox died)."""
    seqs = [SEQS[0], SEQS[1], failed_seq or SEQS[2], SEQS[3]]
    group = make_group(model, "g", seqs, 2, [1.0, 0.0, failed_reward, 1.0], version=0)
    group[2].failure = "sandbox"
    return group


def _update(groups: list[list[Trajectory]]) -> list[torch.Tensor]:
    """The weights after one learner update on `groups`, from the same start every time."""
    model = TinyLM()
    Learner(LearnerSettings.of(CFG), model, packed_logprobs).train_step(groups)
    return [p.detach().clone() for p in model.parameters()]


def test_a_failed_episode_is_out_of_its_groups_baseline() -> None:
    b = collate([usable(_group(TinyLM()))])
    adv = group_advantages(b.rewards, b.groups, CFG.loss)
    assert adv.tolist() == [1 - 2 / 3, 0 - 2 / 3, 1 - 2 / 3]  # the mean of 1, 0, 1
    counted = collate([[dataclasses.replace(t, failure=None) for t in _group(TinyLM())]])
    # scored as a 0, it would have lowered the baseline to 1/2 and been pushed down itself
    assert group_advantages(counted.rewards, counted.groups, CFG.loss).tolist() == [
        0.5, -0.5, -0.5, 0.5]


def test_a_failed_episode_has_no_weight_in_the_loss() -> None:
    """Whatever a failed episode holds (its reward, its tokens), the update is bit for bit
    the one on its group's other episodes alone; counted as reward 0, it would differ."""
    start = TinyLM()
    alone = _update([[t for t in _group(start) if t.failure is None]])
    for reward, seq in ((0.0, None), (5.0, [1, 2, 3, 3, 3, 3])):
        got = _update([usable(_group(start, reward, seq))])
        assert all(torch.equal(a, b) for a, b in zip(got, alone, strict=True))
    as_zero = _update([[dataclasses.replace(t, failure=None) for t in _group(start)]])
    assert not all(torch.equal(a, b) for a, b in zip(as_zero, alone, strict=True))


def _episodes(*failures: str | None) -> list[Trajectory]:
    return [Trajectory("g", [1, 2], [0, 1], [0.0, -1.0], [-1, 0], failure=f) for f in failures]


def test_a_group_is_dropped_when_too_few_episodes_remain() -> None:
    assert not too_few_left(_episodes(None, None, "sandbox", "timeout"), 2)  # 2 left: trains
    assert too_few_left(_episodes(None, "sandbox", "sandbox", "timeout"), 2)  # 1 left
    assert too_few_left(_episodes("sandbox", "env_error"), 2)  # none left
    assert too_few_left(_episodes(None, None, "sandbox"), 3)  # the knob: train.min_group_episodes
    assert not too_few_left(_episodes(None), 2)  # nothing failed: a group trains as it is
    assert [t.failure for t in usable(_episodes(None, "sandbox", None))] == [None, None]


def test_failures_are_counted_by_kind_in_the_metrics_and_the_summary(capsys, monkeypatch
                                                                     ) -> None:
    step0 = _episodes(None, "sandbox", None, None, "timeout", "sandbox", None, None)
    assert failure_metrics(step0) == {"env/failure_frac": 3 / 8, "env/failures/total": 3,
                                      "env/failures/sandbox": 2, "env/failures/timeout": 1}
    assert failure_metrics(_episodes(None, None)) == {"env/failure_frac": 0.0,
                                                      "env/failures/total": 0}
    assert describe(step0) == "3 of 8 episodes failed (sandbox: 2, timeout: 1)"
    recs = [{"step": s, "reward/mean": 0.5, **failure_metrics(e)}
            for s, e in enumerate([step0, _episodes(None, "env_error")])]
    summary = summarize(recs)
    assert {k: v for k, v in summary.items() if k.startswith("env/failures/")} == {
        "env/failures/env_error": 1, "env/failures/sandbox": 2, "env/failures/timeout": 1,
        "env/failures/total": 4}
    monkeypatch.setenv("COLUMNS", "200")
    _print_summary(summary, "runs/x")
    assert ("env failures (not trained on) │ 4 episodes: env_error 1, sandbox 2, timeout 1"
            in capsys.readouterr().out)
    clean = {"step": 0, "reward/mean": 0.5, **failure_metrics(_episodes(None))}
    _print_summary(summarize([clean]), "runs/x")
    assert "env failures" not in capsys.readouterr().out  # none: no row
