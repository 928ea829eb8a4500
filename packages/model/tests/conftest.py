"""Small random models of each family, built with transformers and saved as HF directories."""

from __future__ import annotations

import pytest
import torch

from parity.model import blas

blas.configure()  # before this process's first GEMM, as `parity` does: the kernels run in it


def _hf_model(family: str, **overrides):
    import transformers as tf

    common = dict(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
    )
    common.update(overrides)
    if family == "qwen2":
        cfg, cls = tf.Qwen2Config(**common), tf.Qwen2ForCausalLM
    elif family == "qwen3":
        cfg, cls = tf.Qwen3Config(head_dim=32, **common), tf.Qwen3ForCausalLM
    elif family == "llama":
        cfg, cls = tf.LlamaConfig(**common), tf.LlamaForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(0)
    return cls(cfg).eval()


@pytest.fixture(scope="session")
def hf_factory():
    return _hf_model


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen2")
    _hf_model("qwen2").save_pretrained(d)
    return d
