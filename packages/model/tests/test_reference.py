"""parity's decoder against transformers' (the one place allclose is right)."""

from __future__ import annotations

import pytest
import torch

from parity.model import load_model, token_logprobs

CASES = [
    ("qwen2", {}),
    ("qwen2", {"tie_word_embeddings": True}),
    ("qwen3", {}),
    ("llama", {}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 5e5}),
]


@pytest.mark.parametrize("kernels", ["aligned", "standard"])
@pytest.mark.parametrize(("family", "overrides"), CASES)
def test_logits_match_transformers(tmp_path, hf_factory, family, overrides, kernels):
    hf = hf_factory(family, **overrides)
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path, kernels=kernels)
    tokens = torch.randint(0, 97, (2, 150), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = torch.log_softmax(hf(tokens).logits.float() / 0.7, -1)[:, :-1]
        ref = ref.gather(-1, tokens[:, 1:, None]).squeeze(-1)
        ours = token_logprobs(model, tokens, temperature=0.7)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_saved_model_loads_in_transformers(tmp_path, qwen2_dir):
    import transformers as tf

    from parity.model import save_model

    model = load_model(qwen2_dir)
    save_model(model, tmp_path / "out", max_shard_bytes=40_000)
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    again = load_model(tmp_path / "out")
    for (k, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    hf = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    tokens = torch.randint(0, 97, (1, 40))
    with torch.no_grad():
        ref = torch.log_softmax(hf(tokens).logits.float(), -1)[:, :-1].gather(-1, tokens[:, 1:, None])
    torch.testing.assert_close(token_logprobs(again, tokens), ref.squeeze(-1), rtol=1e-4, atol=1e-4)
