"""The engine's settings: its memory and batching limits (`EngineLimits`, which the trainer's
`[engine]` section extends) and one engine's complete config (`EngineConfig`). Invalid values
are refused at construction, the error naming the field."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from parity.core.config import StrictModel

BlockSize = Literal[1, 2, 4, 8, 16, 32, 64]
"""Tokens per KV block: the divisors of the attention tile (`parity.model.KV_TILE`, 64)."""


class EngineLimits(StrictModel):
    """An engine's limits, all but the size of its KV pool."""

    block_size: BlockSize = Field(16, description="tokens per KV block (divides the attention "
                                  "tile, 64)")
    max_batch_tokens: int = Field(2048, ge=1, description="new tokens one forward call may "
                                  "process (decode rows + prefill chunks)")
    max_seqs: int = Field(256, ge=1, description="sequences holding KV blocks at once")
    max_model_len: int | None = Field(None, ge=2, description="longest sequence (prompt + "
                                      "generated), also capped by the KV pool; empty: the "
                                      "model's max_position_embeddings")
    max_attention_scores: int = Field(2**26, ge=1, description="attention score elements one "
                                      "prefill chunk may materialise, as "
                                      "`parity.model.layout.attention_scores` counts them: long "
                                      "prompts are chunked finer as they grow, so memory stays "
                                      "bounded at any context length (decode rows are never "
                                      "split)")
    prefix_caching: bool = Field(True, description="reuse the K/V of full blocks whose whole "
                                 "prefix matches (earlier turns, a group's shared prompt)")
    dense_kv_mib: int = Field(1024, ge=0, description="memory (MiB) for the running batch's "
                              "K/V kept dense between steps (`kv_cache.DenseBatch`), so decode "
                              "writes each new row instead of gathering every sequence's keys "
                              "from the pool at every layer of every step; a batch that needs "
                              "more gathers at every step; 0: off")


class EngineConfig(EngineLimits):
    """Everything one engine is built with."""

    model_config = ConfigDict(frozen=True)

    kv_blocks: int = Field(2048, ge=1, description="KV-cache blocks in the pool (per layer): "
                           "kv_blocks x block_size token slots, allocated once, zero-initialised")
    seed: int = Field(0, description="seeds the per-request sampling seeds of requests that "
                      "give none")
