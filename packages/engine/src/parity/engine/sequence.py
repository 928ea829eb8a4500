"""One request's state: its tokens, how many of them have K/V in the cache, its blocks."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from parity.core.types import Completion, SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"  # holds no blocks; (re)starts with a prefix-cache lookup
    RUNNING = "running"  # holds blocks for its first num_computed tokens
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """A prompt plus what has been generated so far.

    `tokens` is prompt + generated; `num_computed` of them have K/V in the cache (after a
    preemption it drops to 0 and the tokens are recomputed). `block_table[i]` holds token
    positions i*block_size .. (i+1)*block_size - 1. `logprobs[j]` / `versions[j]` belong to
    generated token j.
    """

    seq_id: int
    tokens: list[int]
    params: SamplingParams
    seed: int
    max_len: int
    num_prompt: int = field(init=False)
    status: Status = Status.WAITING
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # memo of BlockManager.hashes
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        self.num_prompt = len(self.tokens)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed

    def completion(self) -> Completion:
        return Completion(
            token_ids=self.tokens[self.num_prompt :],
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            finish_reason=self.finish_reason or "abort",
        )
