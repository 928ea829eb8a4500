"""The decode bound the engine bench reports: batch x bandwidth / the weight bytes a step reads."""

from __future__ import annotations

from parity.engine.bandwidth import copy_bandwidth, streamed_weight_bytes, tokens_per_s_limit
from parity.engine.shapes import random_model


def test_streamed_weight_bytes_skip_an_untied_embedding_only():
    untied = random_model("test")
    tied = random_model("test", tie_word_embeddings=True)
    every = sum(p.numel() * 4 for p in untied.parameters())
    embed = untied.model.embed_tokens.weight.numel() * 4
    assert streamed_weight_bytes(untied) == every - embed  # its rows are gathered, not streamed
    assert streamed_weight_bytes(tied) == sum(p.numel() * 4 for p in tied.parameters())


def test_the_bound_is_batch_times_bandwidth_over_weight_bytes():
    assert tokens_per_s_limit(8, 2e10, 2e9) == 80.0
    assert copy_bandwidth(2**24, repeats=2) > 0
