"""parity.engine.vllm: rollouts on vLLM (`rollout.engine = "vllm"`), the engine users bring,
behind the parity engine's contract. Its logprobs are not bit-identical to the learner's;
the trainer's `is/d3_mismatch` measures by how much. See docs/vllm.md."""

from parity.engine.vllm.backend import VllmBackend, VllmError, VllmSettings
from parity.engine.vllm.environment import VllmEnvError, check_vllm_env, vllm_python

__all__ = ["VllmBackend", "VllmEnvError", "VllmError", "VllmSettings", "check_vllm_env",
           "vllm_python"]
