"""A 16K-token multi-turn episode: bounded memory, earlier turns reused, learner parity."""

from __future__ import annotations

import pytest
import torch

from parity.engine import Engine, EngineConfig, SamplingParams
from parity.engine.shapes import random_model
from parity.model import token_logprobs


@pytest.mark.slow
def test_16k_multi_turn_episode_runs_in_bounded_memory():
    model = random_model("test", max_position_embeddings=32768)
    cfg = EngineConfig(kv_blocks=1100, max_batch_tokens=2048, max_attention_scores=2**24)
    eng = Engine(model, cfg)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 101, (4000,), generator=g).tolist()
    turns = []
    while len(tokens) < 16384:  # turns start at 4000, 8004, 12008 and 16012 tokens
        c = eng.generate([tokens], SamplingParams(max_new_tokens=4, seed=len(tokens)))[0]
        turns.append((len(tokens), c))
        tokens = tokens + c.token_ids + torch.randint(0, 101, (4000,), generator=g).tolist()
    # the pool never grows; attention scores per step stay within the configured bound
    assert eng.runner.pool.nbytes == 2 * 2 * 1100 * 16 * 2 * 16 * 4
    assert eng.runner.peak_attention_scores <= cfg.max_attention_scores
    # each turn computed only its new tokens: every full block of the turn before was reused
    reused = [(start + len(c.token_ids) - 1) // 16 * 16 for start, c in turns[:-1]]
    assert eng.num_cached_tokens == sum(reused)
    start, last = turns[-1]
    full = torch.tensor([tokens[: start + len(last.token_ids)]])
    ref = token_logprobs(model, full, 1.0, chunk_size=1024)[0, start - 1 :]
    assert torch.equal(torch.tensor(last.logprobs, dtype=torch.float32), ref)


@pytest.mark.slow
def test_128k_multi_turn_episode_runs_in_bounded_memory():
    """Four 32K-token turns on a one-layer, one-head model (attention cost grows with the
    square of the context): the KV pool and the attention scores stay within their configured
    bounds, earlier turns are reused, and the last turn's logprobs equal the learner's."""
    model = random_model(
        "test",
        max_position_embeddings=133120,
        num_hidden_layers=1,
        hidden_size=16,
        intermediate_size=64,
        num_attention_heads=1,
        num_key_value_heads=1,
    )
    cfg = EngineConfig(kv_blocks=8256, max_batch_tokens=4096, max_attention_scores=2**26)
    eng = Engine(model, cfg)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 101, (32764,), generator=g).tolist()  # turns at 32K, 64K, 96K, 128K
    turns = []
    while True:
        c = eng.generate([tokens], SamplingParams(max_new_tokens=4, seed=len(tokens)))[0]
        turns.append((len(tokens), c))
        if len(tokens) + len(c.token_ids) >= 131072:
            break
        tokens = tokens + c.token_ids + torch.randint(0, 101, (32764,), generator=g).tolist()
    start, last = turns[-1]
    assert len(turns) == 4 and start + len(last.token_ids) == 131072
    assert (
        eng.runner.pool.nbytes == 2 * 1 * 8256 * 16 * 1 * 16 * 4
    )  # K and V, 1 layer, 8256 blocks of 16
    assert eng.runner.peak_attention_scores <= cfg.max_attention_scores
    reused = [(s + len(c.token_ids) - 1) // 16 * 16 for s, c in turns[:-1]]
    assert eng.num_cached_tokens == sum(reused)
    full = torch.tensor([tokens + last.token_ids])
    with torch.no_grad():  # 128 chunks of 1024 tokens, each attending to up to 128K keys
        ref = token_logprobs(model, full, 1.0, chunk_size=1024)[0, start - 1 :]
    assert torch.equal(torch.tensor(last.logprobs, dtype=torch.float32), ref)
