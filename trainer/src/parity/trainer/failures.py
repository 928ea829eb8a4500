"""Episodes that failed outside the agent: left out of training, counted.

An episode whose sandbox died, whose env raised, whose engine failed or whose wall-clock
limit ran out comes back with `Trajectory.failure` naming the kind (parity.envs.core). Its
reward (0) says nothing about the policy: scored as a 0 it would pull its group's baseline
down and push the policy away from whatever it did when the machine failed. So it is in
neither: its group trains on its other episodes, their group-mean advantage taken over them
alone, or the group is dropped when fewer than `train.min_group_episodes` remain (one
reward has nothing to be compared with). A group in which nothing failed trains as it is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from parity.core.types import Trajectory


def usable(group: Sequence[Trajectory]) -> list[Trajectory]:
    """The episodes of `group` that did not fail: what the learner trains on."""
    return [t for t in group if t.failure is None]


def too_few_left(group: Sequence[Trajectory], min_episodes: int) -> bool:
    """Whether `group` must be dropped: some of its episodes failed and fewer than
    `min_episodes` did not."""
    left = len(usable(group))
    return left < len(group) and left < min_episodes


def failure_metrics(episodes: Sequence[Trajectory]) -> dict[str, float]:
    """`env/failures/<kind>` for each kind among `episodes`, `env/failures/total`, and
    `env/failure_frac`: the failed share of them."""
    kinds = Counter(t.failure for t in episodes if t.failure is not None)
    total = sum(kinds.values())
    return {"env/failure_frac": total / max(len(episodes), 1), "env/failures/total": total,
            **{f"env/failures/{k}": n for k, n in sorted(kinds.items())}}


def describe(episodes: Sequence[Trajectory]) -> str:
    """'2 of 4 episodes failed (sandbox: 1, timeout: 1)', for messages."""
    kinds = Counter(t.failure for t in episodes if t.failure is not None)
    parts = ", ".join(f"{k}: {n}" for k, n in kinds.most_common())
    return f"{sum(kinds.values())} of {len(episodes)} episodes failed ({parts})"
