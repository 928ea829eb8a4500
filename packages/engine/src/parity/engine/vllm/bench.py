"""vLLM's side of `parity bench engine`: the same model, requests and thread count as the
parity engine's cases, timed the same way (generated tokens / wall time of the batch, or the
wall time of each turn of the multi-turn case's episodes). A case opens its servers first and
keeps them for all its rounds, which interleave with parity's; a server is stopped (SIGSTOP)
outside its own rounds."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import torch

from parity.core.types import SamplingParams
from parity.engine.kv_cache import KVPool
from parity.engine.multi_turn import Episodes, MultiTurnCase, observations, run_episodes
from parity.engine.vllm.backend import VllmBackend, VllmSettings
from parity.model import Decoder, save_model
from parity.model.dtypes import dtype_name


@contextmanager
def serving(model: Decoder, longest: int, seqs: int, compiled: bool = False,
            aligned: bool = False) -> Iterator[VllmBackend]:
    """A vLLM server on `model`'s weights, in its dtype (eager, or with vLLM's torch.compile
    if `compiled`; parity's decoder in it if `aligned`; on as many cores as torch has threads,
    prefix caching on), with KV room for `seqs` sequences of `longest` tokens."""
    kv_bytes = KVPool.bytes_per_token(model.config, model.compute_dtype)
    settings = VllmSettings(max_model_len=longest + 1, max_num_seqs=seqs,
                            num_threads=torch.get_num_threads(), enforce_eager=not compiled,
                            aligned=aligned, dtype=dtype_name(model.compute_dtype),
                            kv_cache_gib=max(1, -(-longest * seqs * kv_bytes // 2**30)))
    with tempfile.TemporaryDirectory(prefix="parity-bench-") as d:
        save_model(model, d)
        backend = VllmBackend(d, settings)
        try:
            yield backend
        finally:
            backend.close()


@contextmanager
def _running(backend: VllmBackend) -> Iterator[None]:
    """The server's processes continued for the duration, stopped again after (SIGSTOP to its
    process group): between its own rounds an idle vLLM server is not idle on a CPU, its
    threads spin and took 35% of parity's tokens/s in the rounds they shared the cores with."""
    os.killpg(backend.proc.pid, signal.SIGCONT)
    try:
        yield
    finally:
        os.killpg(backend.proc.pid, signal.SIGSTOP)


@contextmanager
def _paused(backend: VllmBackend) -> Iterator[VllmBackend]:
    """The server stopped from here on, except inside `_running`; continued before it closes.
    A stopped server cannot see its owner die (its watcher of the owner is stopped too): a
    bench killed meanwhile left three stopped 0.5B servers holding 13 GB. So a watchdog
    outside the server's process group continues it when this process dies, and the server
    then stops itself as it does for any owner that dies."""
    group = backend.proc.pid
    watchdog = subprocess.Popen(
        ["sh", "-c", f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; "
                     f"kill -CONT -{group}"], start_new_session=True)
    os.killpg(group, signal.SIGSTOP)
    try:
        yield backend
    finally:
        os.killpg(group, signal.SIGCONT)
        watchdog.kill()
        watchdog.wait()


def batch_server(model: Decoder, prompts: Sequence[list[int]], params: Sequence[SamplingParams],
                 warm_prefix: bool, compiled: bool, aligned: bool
                 ) -> AbstractContextManager[Callable[[int], float]]:
    """A server for a throughput case, warmed up (one untimed request, or, with `warm_prefix`,
    every prompt prefilled untimed so that timed runs find them in the prefix cache); yields a
    round's measure: tokens/s of one timed batch of the requests, sent unseeded (each draws
    exactly its `max_new_tokens`; vLLM 0.32's CPU build dies on a seeded request whose prompt
    it prefills in chunks, as the long-context case's are)."""
    longest = max(len(p) for p in prompts) + max(p.max_new_tokens for p in params)
    params = [p.model_copy(update={"seed": None}) for p in params]

    @contextmanager
    def run() -> Iterator[Callable[[int], float]]:
        with serving(model, longest, len(prompts), compiled, aligned) as backend:
            one = [p.model_copy(update={"max_new_tokens": 1}) for p in params]
            backend.generate(prompts if warm_prefix else prompts[:1],
                             one if warm_prefix else one[:1])

            def measure(_: int) -> float:
                with _running(backend):
                    t0 = time.perf_counter()
                    outs = backend.generate(prompts, params)
                    return sum(len(c.token_ids) for c in outs) / (time.perf_counter() - t0)

            with _paused(backend):
                yield measure

    return run()


def episodes_server(model: Decoder, case: MultiTurnCase, params: Sequence[SamplingParams],
                    warm_prompt: list[int], compiled: bool, aligned: bool
                    ) -> AbstractContextManager[Callable[[int], Episodes]]:
    """A server for a multi-turn case, warmed up with `warm_prompt`; yields a round's measure:
    round r runs the case's episodes with observations drawn from seed r, as on parity's side,
    so no round finds another's turns in the cache. The requests go unseeded: vLLM 0.32's CPU
    build dies on a seeded request whose prompt it prefills in chunks (rewinding a CPU
    generator's offset: "CPU Generator does not use offset")."""
    unseeded = [p.model_copy(update={"seed": None}) for p in params]

    @contextmanager
    def run() -> Iterator[Callable[[int], Episodes]]:
        with serving(model, case.context_len, case.episodes, compiled, aligned) as backend:
            backend.generate([warm_prompt], [SamplingParams(max_new_tokens=2)])
            vocab = model.config.vocab_size

            def measure(r: int) -> Episodes:
                with _running(backend):
                    return run_episodes(backend, observations(case, vocab, r), unseeded)

            with _paused(backend):
                yield measure

    return run()
