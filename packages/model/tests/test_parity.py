"""Whole-model parity: a sequence's per-token logprobs are the same bits alone, batched
among random others at random positions, computed as prefix + continuation in any chunk
size, and at 1 or 2 threads. The same checks in standard mode must find a difference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.model import KV_TILE, load_model, token_logprobs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, hf_factory):
    d = tmp_path_factory.mktemp("mid")
    # intermediate 1024: the down projection's K is large enough for MKL to split it at 2 threads
    hf_factory("qwen2", hidden_size=128, intermediate_size=1024).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def models(model_dir):
    out = {mode: load_model(model_dir, kernels=mode) for mode in ("aligned", "standard")}
    for mode in ("aligned", "standard"):  # as the learner holds a bf16 model: fp32 masters
        out[f"{mode}-bf16"] = load_model(model_dir, kernels=mode, dtype=torch.bfloat16,
                                         master_weights=True)
    return out


def _checks(model, seq: torch.Tensor, others: torch.Tensor, where: int, chunks: list[int]) -> dict[str, bool]:
    torch.set_num_threads(2)
    with torch.no_grad():
        alone = token_logprobs(model, seq[None])[0]
        batch = torch.cat([others[:where], seq[None], others[where:]])
        lengths = torch.tensor([seq.shape[0]] * batch.shape[0])
        lengths[:where] = torch.randint(2, seq.shape[0] + 1, (where,))
        batched = token_logprobs(model, batch, lengths=lengths)[where]
        chunked = {c: token_logprobs(model, seq[None], chunk_size=c)[0] for c in chunks}
        torch.set_num_threads(1)
        one_thread = token_logprobs(model, seq[None])[0]
        torch.set_num_threads(2)
    out = {"batched": torch.equal(alone, batched), "1 vs 2 threads": torch.equal(alone, one_thread)}
    out.update({f"chunk {c}": torch.equal(alone, v) for c, v in chunked.items()})
    return out


CHUNKS = [1, 7, 9, 15, 17, KV_TILE - 1, KV_TILE, KV_TILE + 1]


@pytest.mark.parametrize("mode", ["aligned", "aligned-bf16"])
@settings(max_examples=6, deadline=None)
@given(t=st.integers(2, 140), n_others=st.integers(1, 5), data=st.data())
def test_aligned_model_is_bit_identical(models, mode, t, n_others, data):
    where = data.draw(st.integers(0, n_others))
    g = torch.Generator().manual_seed(t * 7 + n_others)
    seq = torch.randint(0, 97, (t,), generator=g)
    others = torch.randint(0, 97, (n_others, t), generator=g)
    checks = _checks(models[mode], seq, others, where, CHUNKS)
    assert all(checks.values()), checks


@pytest.mark.parametrize("mode", ["standard", "standard-bf16"])
def test_standard_model_differs(models, mode):
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 97, (130,), generator=g)
    others = torch.randint(0, 97, (4, 130), generator=g)
    checks = _checks(models[mode], seq, others, 2, CHUNKS)
    assert not all(checks.values()), checks


def test_training_gradients_flow_and_match_standard(models, model_dir):
    tokens = torch.randint(0, 97, (3, 40), generator=torch.Generator().manual_seed(5))
    grads = {}
    for mode in ("aligned", "standard"):
        model = load_model(model_dir, kernels=mode)
        lp = token_logprobs(model, tokens, temperature=0.9, lengths=torch.tensor([40, 33, 12]))
        lp.sum().backward()
        grads[mode] = {k: p.grad for k, p in model.named_parameters()}
    assert grads["aligned"].keys() == grads["standard"].keys()
    for k, g in grads["aligned"].items():
        assert g is not None and g.abs().sum() > 0, k
        torch.testing.assert_close(g, grads["standard"][k], rtol=1e-4, atol=1e-5)
