"""vLLM's side of `parity bench engine`: the same model, requests and thread count as the
parity engine's cases, timed the same way (generated tokens / wall time of the batch, or the
wall time of each turn of the multi-turn case's episodes)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from parity.core.types import SamplingParams
from parity.engine.bench import Episodes, MultiTurnCase, observations, run_episodes
from parity.engine.kv_cache import KVPool
from parity.engine.vllm.backend import VllmBackend, VllmSettings
from parity.model import Decoder, save_model


@contextmanager
def _serving(model: Decoder, longest: int, seqs: int, compiled: bool = False,
             aligned: bool = False) -> Iterator[VllmBackend]:
    """A vLLM server on `model`'s weights (eager, or with vLLM's torch.compile if `compiled`;
    parity's decoder in it if `aligned`; on as many cores as torch has threads, prefix caching
    on), with KV room for `seqs` sequences of `longest` tokens."""
    kv_bytes = KVPool.bytes_per_token(model.config, torch.float32)
    settings = VllmSettings(max_model_len=longest + 1, max_num_seqs=seqs,
                            num_threads=torch.get_num_threads(), enforce_eager=not compiled,
                            aligned=aligned,
                            kv_cache_gib=max(1, -(-longest * seqs * kv_bytes // 2**30)))
    with tempfile.TemporaryDirectory(prefix="parity-bench-") as d:
        save_model(model, d)
        backend = VllmBackend(d, settings)
        try:
            yield backend
        finally:
            backend.close()


def vllm_tokens_per_s(model: Decoder, prompts: Sequence[list[int]],
                      params: Sequence[SamplingParams], repeats: int = 2,
                      warm_prefix: bool = False, compiled: bool = False,
                      aligned: bool = False) -> float:
    """Best of `repeats` timed batches on a vLLM server serving `model`'s weights (eager, or
    compiled), after an untimed warm-up batch; `warm_prefix` prefills the prompts untimed
    first, so the timed run finds them in the prefix cache."""
    longest = max(len(p) for p in prompts) + max(p.max_new_tokens for p in params)
    with _serving(model, longest, len(prompts), compiled, aligned) as backend:
        one = [p.model_copy(update={"max_new_tokens": 1}) for p in params]
        backend.generate(prompts if warm_prefix else prompts[:1], one if warm_prefix else one[:1])
        best = 0.0
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = backend.generate(prompts, params)
            dt = time.perf_counter() - t0
            best = max(best, sum(len(c.token_ids) for c in outs) / dt)
        return best


def vllm_episodes(model: Decoder, case: MultiTurnCase, params: Sequence[SamplingParams],
                  warm_prompt: list[int], compiled: bool = False, aligned: bool = False
                  ) -> Episodes:
    """The fastest of `case.repeats` runs of the case's episodes on one vLLM server serving
    `model`'s weights (eager, or compiled; repeat r's observations drawn from seed r, as on
    parity's side, so no run finds another's turns in the cache), after an untimed warm-up request of `warm_prompt`.
    The requests go unseeded: vLLM 0.32's CPU build dies on a seeded request whose prompt it
    prefills in chunks (rewinding a CPU generator's offset: "CPU Generator does not use offset")."""
    unseeded = [p.model_copy(update={"seed": None}) for p in params]
    with _serving(model, case.context_len, case.episodes, compiled, aligned) as backend:
        backend.generate([warm_prompt], [SamplingParams(max_new_tokens=2)])
        vocab = model.config.vocab_size
        runs = [run_episodes(backend, observations(case, vocab, r), unseeded)
                for r in range(case.repeats)]
        return min(runs, key=lambda e: e.seconds)
