"""A training step's record (one line of metrics.jsonl): what the step trained on, how the
learner did, where its time went, the run's counters; and the checks on each batch that stop
a run which cannot train properly. Nothing here talks to an actor."""

from __future__ import annotations

from typing import Any

from parity.core.timing import IDLE, Span, step_seconds
from parity.core.types import Trajectory
from parity.trainer.errors import RunStopped
from parity.trainer.evaluate import pass_rate
from parity.trainer.failures import describe, failure_metrics
from parity.trainer.rundir import sample_episode

# the learner's own seconds in timing/learner_s (actor-seconds of these span categories)
LEARNER_CATS = ("learner_fwd", "learner_bwd", "optim", "checkpoint")


def step_record(step: int, batch_stats: dict[str, float], metrics: dict[str, float],
                spans: list[Span], wall: float, workers: int, counts: dict[str, int]
                ) -> dict[str, Any]:
    """The record of step `step`: `batch_stats` (what it trained on), the learner's
    `metrics` (their `learner/tokens` and `count/skipped_nonfinite` make
    throughput/tokens_per_s and the counter), timings from `spans` (those counted towards
    the step), `wall` its seconds, `workers` the rollout workers, `counts` the run's event
    counts (`Orchestrator.counts`)."""
    secs = step_seconds(spans).get(step, {})
    # the workers' idle state (no episode in flight), held or not
    idle = sum(s.dur for s in spans if s.cat == "state" and s.name == IDLE
               and s.track.startswith("rollout"))
    tokens = metrics["learner/tokens"]
    return {
        "step": step,
        **batch_stats,
        **{k: v for k, v in metrics.items()
           if k not in ("learner/tokens", "count/skipped_nonfinite")},
        "timing/step_s": wall,
        "timing/gen_s": secs.get("gen", 0.0),
        "timing/env_s": secs.get("env", 0.0) + secs.get("reward", 0.0),
        "timing/learner_s": sum(secs.get(c, 0.0) for c in LEARNER_CATS),
        "timing/sync_s": secs.get("sync", 0.0),
        "timing/learner_wait_s": secs.get("learner_wait", 0.0),
        "timing/rollout_idle_frac": min(1.0, idle / max(wall * workers, 1e-9)),
        "throughput/tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "version": step + 1,
        **{f"count/{k}": v for k, v in counts.items()},
    }


def batch_stats(groups: list[list[Trajectory]]) -> dict[str, float]:
    """Reward, pass rate, each reward component's mean (a rubric's weight-0 criteria
    included: they are logged, not trained on), response length, turns and each env
    counter's mean per episode (`env/<name>`: tool_calls, parse_errors, agent/segments, ...;
    0 for an episode without it) of one batch."""
    trajs = [t for g in groups for t in g]
    n = len(trajs)
    names = sorted({k for t in trajs for k in t.reward_components})
    counters = sorted({k for t in trajs for k in t.metrics})
    return {
        "reward/mean": sum(t.reward for t in trajs) / n,
        "reward/pass_rate": pass_rate(trajs),
        **{f"reward/components/{k}": sum(t.reward_components.get(k, 0.0) for t in trajs) / n
           for k in names},
        "response/len_mean": sum(t.num_generated for t in trajs) / n,
        "episode/turns_mean": sum(t.num_turns for t in trajs) / n,
        **{f"env/{k}": sum(t.metrics.get(k, 0.0) for t in trajs) / n for k in counters},
    }


def samples(groups: list[list[Trajectory]], n: int) -> list[dict[str, Any]]:
    """`n` episodes of a batch to show (`output.samples_per_step`): the first of each
    group, then the second, … so that they span tasks before repeating one."""
    order = [g[i] for i in range(max(map(len, groups), default=0)) for g in groups if i < len(g)]
    return [sample_episode(t) for t in order[:n]]


def env_failures(episodes: list[Trajectory], step: int, max_frac: float) -> dict[str, float]:
    """The step's episodes that failed outside the agent, by kind; RunStopped when they are
    more than `max_frac` (train.max_env_failure_frac) of them."""
    metrics = failure_metrics(episodes)
    if metrics["env/failure_frac"] > max_frac:
        raise RunStopped(
            f"{describe(episodes)} in step {step}, more than train.max_env_failure_frac = "
            f"{max_frac}: the env cannot run properly here")
    return metrics


class SignalWatch:
    """Counts the steps in a row whose groups each scored alike (group-mean advantages, and
    so the loss, all 0); RunStopped at `limit` (train.max_steps_without_signal) of them: a
    run that cannot learn (tasks out of the model's reach, a collapsed policy, a reward that
    cannot tell answers apart) must not run on and exit as if it had. Not checkpointed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.without = 0  # steps in a row without a learning signal

    def check(self, groups: list[list[Trajectory]], mean_reward: float, step: int) -> None:
        if any(len({t.reward for t in g}) > 1 for g in groups):
            self.without = 0
            return
        self.without += 1
        if self.without >= self.limit:
            raise RunStopped(
                f"no learning signal for {self.without} steps in a row, up to step {step} "
                f"(train.max_steps_without_signal = {self.limit}): in every group all "
                f"{len(groups[0])} episodes scored the same (mean reward {mean_reward:.3f}), "
                f"so every advantage was 0; the tasks are out of this model's reach, or too "
                f"easy for it")
