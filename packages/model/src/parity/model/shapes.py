"""Named model shapes used by benchmarks, audits and the embedded default."""

from __future__ import annotations

from parity.model.config import ModelConfig

TINY = ModelConfig(
    model_type="qwen2", vocab_size=128, hidden_size=256, intermediate_size=768,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=True,
)
"""The embedded default's shape: a ~3M-parameter Qwen2 (vocab set by its tokenizer)."""

QWEN2_0_5B = ModelConfig(
    model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)
"""Qwen2.5-0.5B's shape (random weights in benchmarks)."""

SHAPES = {"tiny": TINY, "qwen2-0.5b": QWEN2_0_5B}
