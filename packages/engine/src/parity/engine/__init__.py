"""parity.engine: the aligned rollout engine: paged KV cache, continuous batching, prefix
cache, chunked prefill, preemption by recompute, sampling with recorded logprobs,
versioned weight updates.

Importing it loads no torch: the names below load their module on first use, so the
`parity` CLI's help and its engine commands' options answer at once.
"""

import importlib
from typing import Any

_LAZY = {
    "Completion": "parity.core.types", "SamplingParams": "parity.core.types",
    "EngineConfig": "parity.engine.config",
    "Engine": "parity.engine.engine", "EngineInputError": "parity.engine.engine",
    "WeightUpdateError": "parity.engine.weights",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'parity.engine' has no attribute {name!r}")


__all__ = ["Completion", "Engine", "EngineConfig", "EngineInputError", "SamplingParams", "WeightUpdateError"]
