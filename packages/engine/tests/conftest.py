"""A small random Qwen2 (K = 896 in the MLP, so standard GEMMs really differ by row count)."""

from __future__ import annotations

import pytest

from parity.engine import Engine, EngineConfig
from parity.engine.shapes import random_model


@pytest.fixture(scope="module")
def model():
    return random_model("test", "aligned", seed=0)


@pytest.fixture
def engine(model):
    return Engine(model, EngineConfig(kv_blocks=256, max_batch_tokens=256))
