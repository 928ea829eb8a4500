"""A step's record and the batch checks, without Ray."""

from __future__ import annotations

import pytest

from parity.core.timing import IDLE, Span
from parity.core.types import Trajectory
from parity.trainer.driver_state import Counters
from parity.trainer.errors import RunStopped
from parity.trainer.stepmetrics import SignalWatch, batch_stats, env_failures, step_record


def _traj(reward: float, failure: str | None = None) -> Trajectory:
    return Trajectory("g", [1, 2], [0, 1], [0.0, -0.5], [-1, 0], reward=reward,
                      reward_components={"correct": reward}, num_turns=1, failure=failure)


def test_the_record_sums_each_category_of_the_step() -> None:
    spans = [Span("generate", "gen", "rollout-0", 0.0, 1.5, step=3),
             Span("env step", "env", "rollout-0", 0.0, 0.25, step=3),
             Span("env + reward", "reward", "rollout-0", 0.0, 0.5, step=3),
             Span("forward", "learner_fwd", "learner", 0.0, 1.0, step=3),
             Span("optimizer", "optim", "learner", 0.0, 0.5, step=3),
             Span("checkpoint", "checkpoint", "learner", 0.0, 0.25, step=3),
             Span("publish weights", "sync", "learner", 0.0, 0.125, step=3),
             Span(IDLE, "state", "rollout-1", 0.0, 2.0, step=3),
             Span("generate", "gen", "rollout-0", 0.0, 9.0, step=2)]  # another step's
    counters = Counters(skipped_nonfinite=2)
    rec = step_record(3, {"reward/mean": 0.5}, {"loss": 0.25, "learner/tokens": 80.0,
                                                "count/skipped_nonfinite": 2.0},
                      spans, 4.0, 2, {"dropped": 1, **counters.as_dict()})
    assert rec == {
        "step": 3, "reward/mean": 0.5, "loss": 0.25,
        "timing/step_s": 4.0, "timing/gen_s": 1.5, "timing/env_s": 0.75,
        "timing/learner_s": 1.75, "timing/sync_s": 0.125, "timing/learner_wait_s": 0.0,
        "timing/rollout_idle_frac": 0.25, "throughput/tokens_per_s": 20.0, "version": 4,
        "count/dropped": 1, "count/worker_restarts": 0, "count/skipped_nonfinite": 2,
        "count/learner_restarts": 0}
    counters.node_mismatch = 1
    assert step_record(3, {}, {"learner/tokens": 0.0, "count/skipped_nonfinite": 0.0}, [],
                       0.0, 1, counters.as_dict())["count/node_mismatch"] == 1


def test_batch_stats_and_env_failures() -> None:
    groups = [[_traj(1.0), _traj(0.0)], [_traj(0.5)]]
    assert batch_stats(groups) == {
        "reward/mean": 0.5, "reward/pass_rate": 2 / 3,  # reward > 0
        "reward/components/correct": 0.5, "response/len_mean": 1.0, "episode/turns_mean": 1.0}
    episodes = [_traj(0.0, "sandbox"), _traj(1.0), _traj(1.0), _traj(1.0)]
    assert env_failures(episodes, 5, 0.25) == {
        "env/failure_frac": 0.25, "env/failures/total": 1, "env/failures/sandbox": 1}
    with pytest.raises(RunStopped) as e:
        env_failures(episodes, 5, 0.2)
    assert str(e.value) == ("1 of 4 episodes failed (sandbox: 1) in step 5, more than "
                            "train.max_env_failure_frac = 0.2: the env cannot run properly here")


def test_steps_without_a_learning_signal_stop_the_run_at_the_limit() -> None:
    watch = SignalWatch(2)
    alike = [[_traj(1.0), _traj(1.0)], [_traj(0.0), _traj(0.0)]]
    watch.check(alike, 0.5, 0)
    watch.check([[_traj(1.0), _traj(0.0)]], 0.5, 1)  # a signal: the count starts over
    watch.check(alike, 0.5, 2)
    with pytest.raises(RunStopped) as e:
        watch.check(alike, 0.5, 3)
    assert str(e.value) == (
        "no learning signal for 2 steps in a row, up to step 3 (train.max_steps_without_signal "
        "= 2): in every group all 2 episodes scored the same (mean reward 0.500), so every "
        "advantage was 0; the tasks are out of this model's reach, or too easy for it")
