"""vLLM's side of `parity bench engine`: the same model, requests and thread count as the
parity engine's cases, timed the same way (generated tokens / wall time of the batch)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence

import torch

from parity.core.types import SamplingParams
from parity.engine.kv_cache import KVPool
from parity.engine.vllm.backend import VllmBackend, VllmSettings
from parity.model import Decoder, save_model


def vllm_tokens_per_s(model: Decoder, prompts: Sequence[list[int]],
                      params: Sequence[SamplingParams], repeats: int = 2,
                      warm_prefix: bool = False) -> float:
    """Best of `repeats` timed batches on a vLLM server serving `model`'s weights (eager,
    on as many cores as torch has threads), after an untimed warm-up batch; `warm_prefix`
    prefills the prompts untimed first, so the timed run finds them in the prefix cache."""
    longest = max(len(p) for p in prompts) + max(p.max_new_tokens for p in params)
    kv_bytes = KVPool.bytes_per_token(model.config, torch.float32)
    settings = VllmSettings(max_model_len=longest + 1, max_num_seqs=len(prompts),
                            num_threads=torch.get_num_threads(),
                            kv_cache_gib=max(1, -(-longest * len(prompts) * kv_bytes // 2**30)))
    with tempfile.TemporaryDirectory(prefix="parity-bench-") as d:
        save_model(model, d)
        backend = VllmBackend(d, settings)
        try:
            one = [p.model_copy(update={"max_new_tokens": 1}) for p in params]
            backend.generate(prompts if warm_prefix else prompts[:1], one if warm_prefix else one[:1])
            best = 0.0
            for _ in range(repeats):
                t0 = time.perf_counter()
                outs = backend.generate(prompts, params)
                dt = time.perf_counter() - t0
                best = max(best, sum(len(c.token_ids) for c in outs) / dt)
            return best
        finally:
            backend.close()

