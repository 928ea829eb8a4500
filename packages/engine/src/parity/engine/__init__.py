"""parity.engine: the aligned rollout engine: paged KV cache, continuous batching, prefix
cache, chunked prefill, preemption by recompute, sampling with recorded logprobs,
versioned weight updates."""

from parity.core.types import Completion, SamplingParams
from parity.engine.config import EngineConfig
from parity.engine.engine import Engine, EngineInputError
from parity.engine.weights import WeightUpdateError

__all__ = ["Completion", "Engine", "EngineConfig", "EngineInputError", "SamplingParams", "WeightUpdateError"]
