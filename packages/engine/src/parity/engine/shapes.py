"""Random-initialised Qwen2 shapes built in memory, for the audit and the benchmark."""

from __future__ import annotations

import torch

from parity.model import Decoder, ModelConfig

SHAPES: dict[str, dict[str, int]] = {
    # the embedded model's shape
    "tiny": dict(vocab_size=100, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2),
    # Qwen2.5-0.5B's shape
    "qwen2-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2),
    # small enough for the test suite, wide enough (K = 896) for standard GEMMs to differ by row count
    "test": dict(vocab_size=101, hidden_size=64, intermediate_size=896, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}


def random_model(shape: str = "tiny", kernels: str = "aligned", seed: int = 0,
                 max_position_embeddings: int = 131072, **overrides: int) -> Decoder:
    """A Qwen2 decoder of a named shape (fields replaced by `overrides`), seeded random fp32 weights."""
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r} (known: {', '.join(SHAPES)})")
    cfg = ModelConfig(model_type="qwen2", rms_norm_eps=1e-6, rope_theta=1e6,
                      max_position_embeddings=max_position_embeddings,
                      **{**SHAPES[shape], **overrides})
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Decoder(cfg, kernels)
        with torch.no_grad():  # norms away from 1 and non-zero biases: every op matters
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
                elif name.endswith("bias"):
                    p.normal_(0, 0.1)
    return model.eval()
