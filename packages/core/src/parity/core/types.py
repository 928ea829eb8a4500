"""Token-level data shared by the engine, the environments and the trainer.

Everything is in token ids, and the model's output tokens are never re-tokenized: the
tokens the learner trains on are exactly the ones the engine sampled, with the logprobs it
recorded; only the env's observations are tokenized, and appended after them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator


class SamplingParams(BaseModel):
    """How the engine samples one request. Invalid values are refused at construction.

    The recorded logprob of a sampled token is log_softmax(logits / temperature) of that
    token: what the learner recomputes at the same temperature. top-k and top-p only
    restrict which tokens can be drawn (keep them off for exact importance weights);
    temperature 0 samples greedily and records the temperature-1 logprob.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(1.0, ge=0.0, description="0 means greedy (argmax)")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    max_new_tokens: int = Field(256, ge=1)
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None

    @field_validator("stop_strings")
    @classmethod
    def _no_empty_stop(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(s == "" for s in v):
            raise ValueError("stop_strings may not contain the empty string")
        return v


@dataclass(frozen=True)
class TurnTiming:
    """Seconds of one turn of an episode, measured on `time.monotonic`.

    `model_s`: the engine generating the model's turn. `env_s`: the env answering it (its
    `respond`, the observation's tokens; on the last turn also the reward and the release
    of the episode's resources). `sandbox_s`: the part of `env_s` spent in a sandbox.
    """

    model_s: float
    env_s: float
    sandbox_s: float


@dataclass
class Trajectory:
    """One episode as the learner sees it: one flat token sequence.

    `tokens[0]` is the first prompt token. For every position t:
      * `loss_mask[t]` is 1 if the model generated `tokens[t]` (it is trained on), 0 for
        prompt, observation and template tokens;
      * `logprobs[t]` is μ(tokens[t] | tokens[:t]) as recorded by the rollout engine at
        sampling time (0.0 where loss_mask is 0);
      * `versions[t]` is the policy version whose weights produced tokens[t] (-1 where
        loss_mask is 0).
    The four are numpy arrays (tokens int32, loss_mask bool, logprobs float64: whatever
    the engine recorded, exactly; versions int32), built once from what the constructor is
    given: they cross processes as buffers, not as Python ints and floats.

    `reward` is the episode's reward and `reward_components` every reward function's score
    by name (weight 0 too). `num_turns`: the model turns the env answered. `finish_reason`:
    why the episode ended ("answer", "max_turns", "max_tokens", "timeout", ...).

    `failure` is None, or the kind of failure outside the agent that ended the episode
    ("sandbox", "env_error", "reward_error", "timeout", "generate_error"; parity.envs.core):
    its reward says nothing about the policy, so the trainer leaves it out of its group's
    baseline and of the loss (docs/training.md §2).

    `task`: the task the episode played. `messages`: the chat as text, from the prompt on,
    the model's turns as role "assistant". `metrics`: the env's counters summed over the
    turns (e.g. tool_calls, parse_errors). `turn_timings`: one `TurnTiming` per model turn
    the env answered; `reward_s`: the seconds the reward functions took.
    """

    group_id: str
    tokens: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    num_turns: int = 0
    finish_reason: str = ""
    failure: str | None = None
    task: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    turn_timings: list[TurnTiming] = field(default_factory=list)
    reward_s: float = 0.0
    earlier: list[Trajectory] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int32)
        self.loss_mask = np.asarray(self.loss_mask, dtype=bool)
        self.logprobs = np.asarray(self.logprobs, dtype=np.float64)
        self.versions = np.asarray(self.versions, dtype=np.int32)
        n = len(self.tokens)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Trajectory {self.group_id}: {name} has {len(getattr(self, name))} "
                    f"entries for {n} tokens"
                )

    @property
    def num_generated(self) -> int:
        """The tokens the model generated, in every segment."""
        return sum(int(np.count_nonzero(t.loss_mask)) for t in self.segments)

    @property
    def segments(self) -> list[Trajectory]:
        """The episode's token sequences in order: `earlier`, then this one."""
        return [*self.earlier, self]


@dataclass(frozen=True)
class Completion:
    """What the engine returns for one generation request (one model turn).

    `token_ids[i]` was sampled with log-probability `logprobs[i]` (under the distribution
    actually sampled from) by the policy version `versions[i]`. `finish_reason` is "stop"
    (a stop token or string ended the turn; the stop token is the last of `token_ids`),
    "length" (max_new_tokens reached) or "abort" (the request was cancelled).
    """

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"Completion: {n} token_ids but {len(self.logprobs)} logprobs and "
                f"{len(self.versions)} versions"
            )
