"""Bad requests get a clear error naming the field; the engine keeps working."""

from __future__ import annotations

import asyncio
from typing import get_args

import pytest
from pydantic import ValidationError

from parity.engine import EngineConfig, EngineInputError, SamplingParams
from parity.engine.config import BlockSize
from parity.model import KV_TILE


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], SamplingParams(), "prompt is empty"),
        ([1, 2, 101], SamplingParams(), r"prompt\[2\] = 101 is not a token id in \[0, 101\)"),
        ([1, -1], SamplingParams(), r"prompt\[1\] = -1"),
        ([1, "a"], SamplingParams(), r"prompt\[1\] = 'a'"),
        ([1] * 5000, SamplingParams(), "prompt has 5000 tokens; the context holds 4096"),
        ([1], SamplingParams(stop_token_ids=(500,)), r"stop_token_ids \[500\]"),
        ([1], SamplingParams(stop_strings=("x",)), "stop_strings need an engine built with a tokenizer"),
        ([1], {"temperature": 1.0}, "sampling must be a SamplingParams"),
    ],
)
def test_bad_request_is_refused_and_engine_survives(engine, prompt, params, message):
    with pytest.raises(EngineInputError, match=message):
        engine.generate([prompt], params)
    with pytest.raises(EngineInputError, match=message):
        asyncio.run(engine.agenerate(prompt, params))
    assert engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))[0].finish_reason == "length"


def test_one_bad_prompt_in_a_batch_names_its_index(engine):
    with pytest.raises(EngineInputError, match="request 1: prompt is empty"):
        engine.generate([[1], []], SamplingParams())
    assert not engine.scheduler.has_work()


@pytest.mark.parametrize("kw", [{"temperature": -1}, {"top_p": 0}, {"top_k": -2}, {"max_new_tokens": 0},
                                {"stop_strings": ("",)}])
def test_invalid_sampling_params_are_refused(kw):
    with pytest.raises(ValidationError):
        SamplingParams(**kw)


@pytest.mark.parametrize(("kw", "message"), [
    ({"block_size": 24}, r"block_size\n  Input should be 1, 2, 4, 8, 16, 32 or 64"),
    ({"kv_blocks": 0}, r"kv_blocks\n  Input should be greater than or equal to 1"),
    ({"dense_kv_mib": -1}, r"dense_kv_mib\n  Input should be greater than or equal to 0"),
    ({"max_model_len": 1}, r"max_model_len\n  Input should be greater than or equal to 2"),
    ({"prefix_cache": False}, r"prefix_cache\n  Extra inputs are not permitted"),
])
def test_invalid_engine_config(kw, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kw)


def test_block_sizes_are_the_divisors_of_the_attention_tile():
    assert get_args(BlockSize) == tuple(d for d in range(1, KV_TILE + 1) if KV_TILE % d == 0)
