"""Rewards as a rubric: a weighted sum of named reward functions.

A reward function takes the finished `Episode` and returns a float (or an awaitable of one).
Weight 0 makes it a logged metric that does not count toward the reward. A function that
raises scores 0 and is counted in `RubricScore.errors`; it never ends the rollout, but when
it counts toward the reward the episode is marked failed ("reward_error"): its reward is
wrong.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parity.envs.episode import Episode

log = logging.getLogger(__name__)

RewardFn = Callable[["Episode"], "float | Awaitable[float]"]


@dataclass(frozen=True)
class Criterion:
    """One reward function, its weight and the name its score is logged under."""

    fn: RewardFn
    weight: float = 1.0
    name: str = ""

    @property
    def key(self) -> str:
        return self.name or getattr(self.fn, "__name__", "reward")


@dataclass
class RubricScore:
    """`reward` = Σ weight·score; `components` holds every score by name (weight 0 too);
    `errors` counts functions that raised or returned a non-finite value (scored 0);
    `counted_errors` those of them whose weight is not 0, which make `reward` wrong."""

    reward: float
    components: dict[str, float] = field(default_factory=dict)
    errors: int = 0
    counted_errors: int = 0


class Rubric:
    """A weighted sum of reward functions, scored once per episode."""

    def __init__(self, criteria: Sequence[Criterion]) -> None:
        keys = [c.key for c in criteria]
        if len(set(keys)) != len(keys):
            raise ValueError(f"rubric: duplicate reward names in {keys}")
        self.criteria = list(criteria)

    async def score(self, episode: Episode) -> RubricScore:
        out = RubricScore(0.0)
        for c in self.criteria:
            try:
                value = c.fn(episode)
                if inspect.isawaitable(value):
                    value = await value
                value = float(value)
                if not math.isfinite(value):
                    raise ValueError(f"non-finite reward {value}")
            except Exception:  # a broken reward function must not end the rollout
                log.exception("reward function %s failed; scored 0", c.key)
                value = 0.0
                out.errors += 1
                out.counted_errors += c.weight != 0
            out.components[c.key] = value
            out.reward += c.weight * value
        return out
