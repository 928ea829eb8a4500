"""Random-initialised model shapes built in memory, for the audit and the benchmark."""

from __future__ import annotations

import torch

from parity.model import Decoder, DenseKV, ModelConfig, SeqLayout
from parity.model.shapes import SHAPES as MODEL_SHAPES

SHAPES: dict[str, ModelConfig] = {
    **MODEL_SHAPES,  # "tiny" (the embedded model's shape) and "qwen2-0.5b"
    # small enough for the test suite, wide enough (K = 896) for standard GEMMs to differ by row count
    "test": ModelConfig(model_type="qwen2", vocab_size=101, hidden_size=64,
                        intermediate_size=896, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6),
    # q/k norm, a head dim apart from hidden / heads, 4 query heads per KV head, untied head
    "qwen3-small": ModelConfig(model_type="qwen3", vocab_size=512, hidden_size=256,
                               intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
                               num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
                               rope_theta=1e6),
    # no biases, one query head per KV head, K = 2048 in the down projection (several of a
    # BLAS's K blocks), a 1000-token untied head
    "llama-wide": ModelConfig(model_type="llama", vocab_size=1000, hidden_size=384,
                              intermediate_size=2048, num_hidden_layers=2, num_attention_heads=6,
                              num_key_value_heads=6, rms_norm_eps=1e-5, rope_theta=5e5),
}
AUDIT_SHAPES = ("tiny", "qwen3-small", "llama-wide")
"""What `parity audit` runs by default: three families, G = 2, 4 and 1, K up to 2048."""

LOGIT_STD = 2.0
"""Random models' logits are scaled to this spread: their next-token distributions are
uncertain, as a parity audit needs (a saturated softmax hides every difference)."""


def random_model(shape: str = "tiny", kernels: str = "aligned", seed: int = 0,
                 max_position_embeddings: int = 131072, dtype: torch.dtype = torch.float32,
                 **overrides: int) -> Decoder:
    """A decoder of a named shape (fields replaced by `overrides`), seeded random weights
    (drawn in fp32, then held in `dtype`, which it computes in), its output projection
    scaled so the logits of random tokens have std LOGIT_STD."""
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
            tokens = torch.randint(0, cfg.vocab_size, (64,))
            layout = SeqLayout.from_lengths([64])
            for _ in range(3):  # tied heads scale the input embeddings too: settle in a few steps
                logits = model.logits(model(tokens, layout, DenseKV()))
                model.lm_head_weight.mul_(LOGIT_STD / float(logits.std()))
    return model.cast(dtype).eval()
