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


@pytest.fixture
def gemm_attention(monkeypatch):
    """Aligned attention by GEMM tiles, as on a machine where the fused kernel cannot be
    built: the engine then gathers keys (and keeps the running batch dense)."""
    from parity.model import fused

    monkeypatch.setattr(fused, "_build", lambda: (None, "disabled for this test"))
