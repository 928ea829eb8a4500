"""Token-level data shared by the engine, the environments and the trainer.

Everything is in token ids: the model's output tokens are never re-tokenized, only
observations are tokenized and appended (design invariant 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

    `failure` is None, or the kind of failure outside the agent that ended the episode
    ("sandbox", "env_error", "reward_error", "timeout", "generate_error"; parity.envs.core):
    its reward says nothing about the policy, so the trainer leaves it out of its group's
    baseline and of the loss (docs/training.md §2).
    """

    group_id: str
    tokens: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    num_turns: int = 0
    finish_reason: str = ""
    failure: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Trajectory {self.group_id}: {name} has {len(getattr(self, name))} "
                    f"entries for {n} tokens"
                )

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)

    @property
    def min_version(self) -> int:
        """The oldest policy version among the generated tokens (-1 if none)."""
        vs = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]
        return min(vs) if vs else -1


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
