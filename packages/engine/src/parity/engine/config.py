"""EngineConfig: the engine's memory and batching limits."""

from __future__ import annotations

from dataclasses import dataclass

from parity.model import KV_TILE


@dataclass(frozen=True)
class EngineConfig:
    """Limits of one engine. Invalid values are refused at construction.

    kv_blocks: KV-cache blocks in the pool (per layer); memory is kv_blocks * block_size
        token slots, allocated once, zero-initialised.
    block_size: tokens per block; must divide the attention tile (KV_TILE = 64).
    max_batch_tokens: new tokens one forward call may process (decode rows + prefill chunks).
    max_seqs: sequences that may hold KV blocks (be running) at once.
    max_model_len: longest sequence (prompt + generated); None = the model's
        max_position_embeddings. Also capped by the pool size.
    max_attention_scores: attention score elements one prefill chunk may materialise, as
        `parity.model.layout.attention_scores` counts them; long prompts are chunked finer as
        they grow, so memory stays bounded at any context length (decode rows are never split).
    prefix_caching: reuse full blocks whose content (and whole prefix) matches.
    dense_kv_mib: memory (MiB) for the running batch's keys and values kept dense between
        steps (`kv_cache.DenseBatch`): decode then writes each new row there instead of
        gathering every sequence's keys from the pool at every layer of every step. A batch
        whose dense K/V would exceed it gathers at every step; 0 turns it off.
    seed: seeds the per-request sampling seeds of requests that give none.
    """

    kv_blocks: int = 2048
    block_size: int = 16
    max_batch_tokens: int = 2048
    max_seqs: int = 256
    max_model_len: int | None = None
    max_attention_scores: int = 2**26
    prefix_caching: bool = True
    dense_kv_mib: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("kv_blocks", "block_size", "max_batch_tokens", "max_seqs", "max_attention_scores"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if KV_TILE % self.block_size:
            raise ValueError(f"EngineConfig.block_size must divide {KV_TILE}, got {self.block_size}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"EngineConfig.max_model_len must be >= 2, got {self.max_model_len}")
        if not isinstance(self.dense_kv_mib, int) or self.dense_kv_mib < 0:
            raise ValueError(f"EngineConfig.dense_kv_mib must be an int >= 0, got {self.dense_kv_mib!r}")
