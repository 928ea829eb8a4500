"""parity.engine.vllm: rollouts on vLLM (`rollout.engine = "vllm"`), the engine users bring,
behind the parity engine's contract. Its logprobs are not bit-identical to the learner's;
the trainer's `is/d3_mismatch` measures by how much. See docs/vllm.md.

Importing it loads no torch: the names below load their module on first use, so a run's
config (`VllmOptions`) is read without the backend."""

import importlib
from typing import Any

_LAZY = {
    "VllmBackend": "backend", "VllmError": "backend",
    "VllmEnvError": "environment", "check_vllm_env": "environment", "vllm_python": "environment",
    "VllmOptions": "settings", "VllmSettings": "settings",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"parity.engine.vllm.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'parity.engine.vllm' has no attribute {name!r}")


__all__ = ["VllmBackend", "VllmEnvError", "VllmError", "VllmOptions", "VllmSettings",
           "check_vllm_env", "vllm_python"]
