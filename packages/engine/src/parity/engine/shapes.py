"""Random-initialised Qwen2 shapes built in memory, for the audit and the benchmark."""

from __future__ import annotations

import torch

from parity.model import Decoder, ModelConfig
from parity.model.shapes import SHAPES as MODEL_SHAPES

SHAPES: dict[str, ModelConfig] = {
    **MODEL_SHAPES,  # "tiny" (the embedded model's shape) and "qwen2-0.5b"
    # small enough for the test suite, wide enough (K = 896) for standard GEMMs to differ by row count
    "test": ModelConfig(model_type="qwen2", vocab_size=101, hidden_size=64,
                        intermediate_size=896, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6),
}


def random_model(shape: str = "tiny", kernels: str = "aligned", seed: int = 0,
                 max_position_embeddings: int = 131072, **overrides: int) -> Decoder:
    """A decoder of a named shape (fields replaced by `overrides`), seeded random fp32 weights."""
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r} (known: {', '.join(SHAPES)})")
    cfg = SHAPES[shape].model_copy(
        update={"max_position_embeddings": max_position_embeddings, **overrides}
    )
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
