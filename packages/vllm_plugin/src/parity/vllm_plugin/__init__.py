"""parity's decoder as a vLLM model ("vllm-aligned" rollouts).

vLLM loads this package's `register` in every process it starts (the engine core and each
worker) through the `vllm.general_plugins` entry point. It registers parity's own decoder,
with its aligned kernels, under `Parity` + each architecture parity implements; a server
selects it with `hf_overrides={"architectures": [aligned_architecture(...)]}`. vLLM keeps its
scheduler, paged KV cache, prefix cache, chunked prefill, preemption and sampler; every
reducing op of the forward is parity's, so the logprobs are the learner's, bit for bit.

The model reads vLLM's private internals (forward context, the CPU cache layout, attention
metadata), which change between releases: `register` refuses any vLLM but VLLM_VERSION.
"""

from __future__ import annotations

import logging

from parity.model.config import ARCHITECTURES

VLLM_VERSION = "0.32.0"  # the release the model's use of vLLM internals is written for
PREFIX = "Parity"
MODEL_CLASS = "parity.vllm_plugin.model:ParityForCausalLM"

logger = logging.getLogger(__name__)


class PluginError(RuntimeError):
    """vLLM cannot run parity's decoder here (its version, the architecture, the cache)."""


def aligned_architecture(architecture: str) -> str:
    """The registered name of parity's decoder for a checkpoint's `architecture`;
    PluginError naming it when parity's decoder does not implement it."""
    if architecture not in ARCHITECTURES:
        raise PluginError(f"architecture {architecture!r} is not implemented by parity's decoder "
                          f"(vllm-aligned runs {', '.join(ARCHITECTURES)})")
    return PREFIX + architecture


def check_vllm_version(version: str) -> None:
    if version != VLLM_VERSION:
        raise PluginError(f"parity's vLLM plugin is written for vLLM {VLLM_VERSION} (it uses its "
                          f"internals); this environment has vLLM {version}: rebuild it with "
                          f"`bash scripts/build_vllm_env.sh`")


def register() -> None:
    """vLLM's plugin hook: register parity's decoder for every architecture it implements,
    unless this vLLM is not the pinned one (then vllm-aligned servers refuse to start)."""
    import vllm
    from vllm import ModelRegistry

    try:
        check_vllm_version(vllm.__version__)
    except PluginError as e:
        logger.error("%s", e)
        return
    for architecture in ARCHITECTURES:
        ModelRegistry.register_model(PREFIX + architecture, MODEL_CLASS)
