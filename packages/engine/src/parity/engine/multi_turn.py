"""The engine bench's multi-turn episodes, on any rollout backend (the parity engine, or
vLLM's in `parity.engine.vllm.bench`): the case (`MultiTurnCase`), the observations each turn
appends, and one timed run of the episodes (`run_episodes`, whose result is `Episodes`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from parity.core.types import Completion, SamplingParams
from parity.engine.config import EngineConfig

BLOCK_SIZE: int = EngineConfig.model_fields["block_size"].default
"""The engine's default block size: the prefix cache's unit, only full blocks are reused."""


@dataclass(frozen=True)
class MultiTurnCase:
    """`episodes` concurrent episodes of `turns` turns (at least 2). Turn 0 prompts with one
    observation of `observation_len` random token ids; turn k with turn k-1's prompt, the
    `new_tokens` it generated and a new observation. Every turn is one batched `generate` of
    all episodes (its latency: that call's wall time); a run starts on a fresh engine."""

    name: str
    shape: str
    episodes: int
    turns: int
    observation_len: int
    new_tokens: int
    repeats: int = 2
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.turns < 2:
            raise ValueError(f"MultiTurnCase.turns must be >= 2 (turn 1 is the first to hit the "
                             f"prefix cache), got {self.turns}")

    @property
    def context_len(self) -> int:
        """Tokens of an episode at its end: every observation and every generated token."""
        return self.turns * (self.observation_len + self.new_tokens)

    def engine_config(self) -> EngineConfig:
        """Room for every block an episode allocates over its turns (at most its context's
        blocks plus one partial block per turn), so no cached block is ever evicted."""
        per_seq = -(-self.context_len // BLOCK_SIZE) + self.turns
        return EngineConfig(kv_blocks=self.episodes * per_seq, max_batch_tokens=2048,
                            max_seqs=self.episodes)


def observations(case: MultiTurnCase, vocab: int, seed: int) -> list[list[list[int]]]:
    """[episode][turn]: the observation token ids that turn appends, drawn from `seed`."""
    g = torch.Generator().manual_seed(seed)
    shape = (case.episodes, case.turns, case.observation_len)
    return torch.randint(0, vocab, shape, generator=g).tolist()


class RolloutBackend(Protocol):
    """What drives an episode: the parity engine, or vLLM's backend (`generate`, and the
    running count of prompt tokens its prefix cache served)."""

    @property
    def num_cached_tokens(self) -> int: ...

    def generate(self, prompts: Sequence[Sequence[int]],
                 sampling: Sequence[SamplingParams]) -> list[Completion]: ...


@dataclass(frozen=True)
class Episodes:
    """One run of a MultiTurnCase's episodes."""

    turn_s: list[float]  # wall time of each turn's generate call (that turn of every episode)
    prompt_tokens: int  # prompt tokens of every turn of every episode
    cached_tokens: int  # of them, those whose K/V the prefix cache served (not recomputed)

    @property
    def seconds(self) -> float:
        """The whole run: every turn of every episode."""
        return sum(self.turn_s)

    def report(self) -> dict:
        """Per-turn latency in ms (mean, p50, p90, max over the turns), the run's seconds,
        and prompt tokens served from the cache vs prefilled."""
        ms = [1000 * s for s in self.turn_s]
        deciles = statistics.quantiles(ms, n=10, method="inclusive")
        return {"turn_ms_mean": round(statistics.fmean(ms), 2), "turn_ms_p50": round(deciles[4], 2),
                "turn_ms_p90": round(deciles[8], 2), "turn_ms_max": round(max(ms), 2),
                "episode_s": round(self.seconds, 3), "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens,
                "prefilled_tokens": self.prompt_tokens - self.cached_tokens}


def run_episodes(gen: RolloutBackend, observations: list[list[list[int]]],
                 params: Sequence[SamplingParams]) -> Episodes:
    """Every turn of the episodes (`observations[episode][turn]`), one `gen.generate` call per
    turn; episode e samples with `params[e]`."""
    contexts: list[list[int]] = [[] for _ in observations]
    turn_s, prompt_tokens, cached_before = [], 0, gen.num_cached_tokens
    for turn in range(len(observations[0])):
        prompts = [ctx + obs[turn] for ctx, obs in zip(contexts, observations, strict=True)]
        start = time.perf_counter()
        outs = gen.generate(prompts, params)
        turn_s.append(time.perf_counter() - start)
        prompt_tokens += sum(len(p) for p in prompts)
        contexts = [p + o.token_ids for p, o in zip(prompts, outs, strict=True)]
    return Episodes(turn_s, prompt_tokens, gen.num_cached_tokens - cached_before)
