"""A rollout backend on vLLM, behind the contract of parity's engine (`agenerate`,
`update_weights`, `version`): token ids in, token ids out, the processed logprob of each
sampled token, the policy version that produced it.

vLLM pins its own torch, so it runs in an environment of its own
(`scripts/build_vllm_env.sh`) as a server process (guest/parity_vllm_server.py) that this
backend starts and reaches with httpx over a Unix socket: no network port, every call under
a timeout, and a server that dies is seen at once (its exit code and the tail of its log in
the error) instead of hanging the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from parity.core.timing import GENERATING, StateClock
from parity.core.types import Completion, SamplingParams
from parity.engine.engine import EngineInputError
from parity.engine.vllm.environment import check_vllm_env
from parity.engine.vllm.guest.parity_vllm_server import remove_shared_memory
from parity.engine.vllm.settings import VllmSettings
from parity.engine.weights import WeightUpdateError

GUEST = Path(__file__).parent / "guest"


class VllmError(RuntimeError):
    """The vLLM server failed: it did not start, died, timed out or answered with an error."""


def _stop(proc: subprocess.Popen[bytes], shm_list: Path, grace_s: float = 15.0) -> None:
    """Stop the server and every process of its group (vLLM's engine core and worker
    outlive a server that was killed: they must not be left holding memory). The server
    alone is asked: it shuts vLLM's engine down, and its guard then frees the group's
    shared memory and kills what is left (2 s; asking every process of the group at once
    took 6.6 s). The shared memory the server recorded (`shm_list`) is removed here too,
    for a group killed with its guard. A server already gone (reaped: its pid no longer
    answers) cannot shut anything down, and its group is killed at once."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()  # reaped, the server no longer counts as a member of its group
            if not _group_alive(proc.pid):
                break
            time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):  # none left: the group is gone
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    remove_shared_memory(shm_list)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def server_env(s: VllmSettings) -> dict[str, str]:
    """The environment of a vLLM server process: this one's, less its Python settings, plus
    vLLM's (threads on this process's cores, its KV space, loopback only)."""
    cores = sorted(os.sched_getaffinity(0))
    cores = cores[:s.num_threads] if s.num_threads else cores
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env |= {
        "PYTHONPATH": str(GUEST),  # the worker extension's module
        "VLLM_CPU_KVCACHE_SPACE": str(s.kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
        "OMP_NUM_THREADS": str(len(cores)),
        "VLLM_HOST_IP": "127.0.0.1",  # its internal queues stay on loopback
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
        "VLLM_BATCH_INVARIANT": "1" if s.batch_invariant else "0",
    }
    # huge pages for the weights vLLM packs (glibc's malloc madvises its large blocks) and
    # for torch's tensors: the 0.5B shape's decode ran 4.5% faster with both, in vLLM's
    # own model and in parity's alike (docs/vllm.md); a user's own settings win
    env.setdefault("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return env


class VllmBackend:
    """One vLLM server on `model_dir` (weights version 0 until `update_weights`)."""

    def __init__(self, model_dir: str | Path, settings: VllmSettings | None = None,
                 log_dir: str | Path | None = None) -> None:
        self.settings = s = settings or VllmSettings()
        self.model_dir = Path(model_dir)
        self.env = check_vllm_env(s.python, aligned=s.aligned)
        self.version = 0
        self.state_clock: StateClock | None = None  # a rollout worker's
        self._in_flight = 0
        self.num_cached_tokens = 0  # prompt tokens vLLM's prefix cache served, all requests
        self._before: str | None = None  # the clock's state before the first request
        self._dir = Path(tempfile.mkdtemp(prefix="parity-vllm-"))
        self.socket = self._dir / "server.sock"
        self.log_path = Path(log_dir or self._dir) / f"vllm-server-{os.getpid()}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._keep_log = log_dir is not None  # else it goes with the socket's directory on close
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self.proc = self._spawn()
        # the /dev/shm files of the server's group, as it records them (its guard's list)
        self.shared_memory = self._dir / "shared-memory"
        self._finalizer = weakref.finalize(self, _stop, self.proc, self.shared_memory)
        try:
            self.info = self._wait_ready()
        except BaseException:
            self.close()
            raise
        self.max_model_len = int(self.info["max_model_len"])
        # aligned: the vLLM worker's proof and fingerprint of parity's kernels, made in its
        # own process on vLLM's torch (parity.model.selfcheck.probe); None otherwise
        self.probe: dict[str, Any] | None = self.info.get("probe")

    # ------------------------------------------------------------------ the server

    def _spawn(self) -> subprocess.Popen[bytes]:
        s = self.settings
        cmd = [self.env["python"], str(GUEST / "parity_vllm_server.py"), "--model",
               str(self.model_dir), "--uds", str(self.socket), "--seed", str(s.seed), "--dtype", s.dtype,
               "--max-num-seqs", str(s.max_num_seqs),
               # a killed rollout worker must not leave vLLM behind: it watches this pid
               "--parent-pid", str(os.getpid())]
        if s.max_model_len:
            cmd += ["--max-model-len", str(s.max_model_len)]
        if s.enforce_eager:
            cmd.append("--enforce-eager")
        if s.aligned:
            cmd.append("--aligned")
        if s.max_num_batched_tokens:
            cmd += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
        if s.num_kv_blocks:
            cmd += ["--num-kv-blocks", str(s.num_kv_blocks)]
        env = server_env(s)
        log = self.log_path.open("ab")
        try:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        finally:
            log.close()

    @property
    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self.proc.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def _died(self) -> VllmError:
        self._keep_log = True  # the error names it
        _stop(self.proc, self.shared_memory)  # what is left of its group
        return VllmError(f"the vLLM server exited with code {self.proc.returncode}; the end "
                         f"of its log {self.log_path}:\n{self.log_tail()}")

    def _wait_ready(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.settings.start_timeout_s
        with self._sync_client() as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise self._died()
                if self.socket.exists():
                    try:
                        return client.get("/health").raise_for_status().json()
                    except httpx.TransportError:
                        pass
                time.sleep(0.5)
        self._keep_log = True
        raise VllmError(f"the vLLM server did not start within vllm.start_timeout_s = "
                        f"{self.settings.start_timeout_s:g} s; the end of its log "
                        f"{self.log_path}:\n{self.log_tail()}")

    def preemptions(self) -> int:
        """Sequences vLLM preempted (their KV freed, recomputed later) since it started: its
        `vllm:num_preemptions_total`, from /health."""
        with self._sync_client() as client:
            return int(client.get("/health").raise_for_status().json()["preemptions"])

    def _sync_client(self) -> httpx.Client:
        """A blocking client of the server's socket, for calls outside an event loop."""
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)),
                            base_url="http://vllm", timeout=10)

    def close(self) -> None:
        """Stop the server (and its engine processes); idempotent."""
        self._finalizer()
        self._client = None
        if not self._keep_log:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _http(self) -> httpx.AsyncClient:
        # an AsyncClient's connections belong to the event loop that opened them
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=str(self.socket)),
                base_url="http://vllm", timeout=self.settings.request_timeout_s,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
            self._client_loop = loop
        return self._client

    async def _call(self, path: str, **kwargs: Any) -> dict[str, Any]:
        if self.proc.poll() is not None:
            raise self._died()
        try:
            r = await self._http().post(path, **kwargs)
        except httpx.TimeoutException:
            raise VllmError(f"vLLM did not answer {path} within vllm.request_timeout_s = "
                            f"{self.settings.request_timeout_s:g} s") from None
        except httpx.TransportError as e:
            await asyncio.sleep(0.5)  # a dying server: let its exit code arrive
            if self.proc.poll() is not None:
                raise self._died() from None
            raise VllmError(f"vLLM's {path} failed: {type(e).__name__}: {e}") from None
        body = r.json()
        if r.status_code == 400:
            raise ValueError(body["error"])
        if r.status_code != 200:
            self._keep_log = True
            raise VllmError(f"vLLM's {path} failed: {body.get('error', r.text)} (its log: "
                            f"{self.log_path})")
        return body

    # ------------------------------------------------------------------ the contract

    async def agenerate(self, prompt_ids: Sequence[int], sampling: SamplingParams | None = None
                        ) -> Completion:
        """One request; concurrent calls are batched by vLLM. All tokens of a request come
        from one weights version (updates wait for the requests in flight)."""
        sp = sampling or SamplingParams()
        req = {"prompt_ids": list(prompt_ids), "temperature": sp.temperature, "top_p": sp.top_p,
               "top_k": sp.top_k, "max_new_tokens": sp.max_new_tokens,
               "stop_token_ids": list(sp.stop_token_ids), "stop_strings": list(sp.stop_strings),
               "seed": sp.seed}
        self._mark(+1)
        try:
            out = await self._call("/generate", json=req)
        except ValueError as e:
            raise EngineInputError(str(e)) from None
        finally:
            self._mark(-1)
        self.num_cached_tokens += out["cached_tokens"]
        n = len(out["token_ids"])
        return Completion(out["token_ids"], out["logprobs"], [out["version"]] * n,
                          out["finish_reason"])

    def generate(self, prompts: Sequence[Sequence[int]],
                 sampling: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[Completion]:
        """Run the prompts concurrently to completion (the parity engine's `generate`)."""
        sampling = sampling or SamplingParams()
        params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
        if len(params) != len(prompts):
            raise EngineInputError(f"{len(prompts)} prompts but {len(params)} SamplingParams")

        async def run() -> list[Completion]:
            try:
                return list(await asyncio.gather(*(self.agenerate(p, s)
                                                   for p, s in zip(prompts, params, strict=True))))
            finally:  # its connections belong to this loop, which ends here
                if self._client is not None:
                    await self._client.aclose()
                    self._client = None

        return asyncio.run(run())

    async def update_weights(self, state: Mapping[str, Any], version: int) -> float:
        """Load `state` (parity's names, which are Hugging Face's) as `version` into the
        running engine, once the requests in flight are done; returns the load's seconds.
        WeightUpdateError (nothing loaded) for a bad version, a non-finite value, or a name,
        shape or dtype the model does not have."""
        import torch
        from safetensors.torch import save

        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise WeightUpdateError(f"version must be a non-negative int, got {version!r}")
        tensors = {k: v.detach().contiguous() for k, v in state.items()}
        bad = [k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if bad:
            raise WeightUpdateError(f"weight update has non-finite values in {', '.join(bad[:8])}")
        try:
            out = await self._call("/weights", content=save(tensors),
                                   headers={"x-parity-version": str(version)})
        except ValueError as e:
            raise WeightUpdateError(str(e)) from None
        self.version = version
        return float(out["load_s"])

    def _mark(self, delta: int) -> None:
        """The worker's state clock shows requests in flight (vLLM's steps are not seen)."""
        self._in_flight += delta
        clock = self.state_clock
        if clock is None:
            return
        if delta > 0 and self._in_flight == 1:
            self._before = clock.enter(GENERATING)
        elif delta < 0 and self._in_flight == 0 and clock.state == GENERATING:
            clock.enter(self._before)

