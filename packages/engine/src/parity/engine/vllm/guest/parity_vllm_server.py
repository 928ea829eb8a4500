"""parity's vLLM server: runs in vLLM's own interpreter (scripts/build_vllm_env.sh), not in
parity's. With `--aligned` vLLM runs parity's own decoder (the `parity.vllm_plugin` package,
installed in that environment with the parity packages it needs) and its logprobs are the
learner's bit for bit; without, vLLM's own model, and this file imports nothing of parity.

It serves one model over HTTP on a Unix socket (no network port) with the contract of
parity's engine:

  POST /generate  {"prompt_ids": [...], "temperature", "top_p", "top_k", "max_new_tokens",
                   "stop_token_ids", "stop_strings", "seed"}
               -> {"token_ids", "logprobs", "version", "finish_reason", "cached_tokens"}
     Token ids in, token ids out. `logprobs[i]` is vLLM's processed logprob of
     `token_ids[i]` (temperature, top-k and top-p applied: the distribution sampled from).
     Only the request's stop ids end it (the model's EOS is not added behind its back).
  POST /weights   body: safetensors bytes, header `x-parity-version`
               -> {"version", "load_s", "drain_s"}
     Loads the weights into the running engine (vLLM's worker extension + collective_rpc),
     after the requests in flight have finished; requests that arrive meanwhile wait, so
     every request runs on one version, the one it reports. A tensor whose name, shape or
     dtype differs from the checkpoint's is refused (400) before anything is loaded.
  GET  /health -> {"version", "model", "max_model_len", "vllm", "aligned", "probe",
                   "preemptions"}
     `probe` (aligned only): the vLLM worker's own proof of parity's aligned kernels and
     their fingerprint at the model's shapes (parity.model.selfcheck.probe), computed in that
     process, on vLLM's torch, at start-up. `preemptions`: vLLM's
     vllm:num_preemptions_total since it started.

Errors are JSON {"error": "..."} with status 400 (a bad request) or 500. (No `from
__future__ import annotations`: FastAPI reads the handlers' annotations at run time.)
"""

import argparse
import asyncio
import contextlib
import json
import os
import signal
import struct
import time
import uuid
from collections.abc import Callable
from pathlib import Path

SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


class ParityWorkerExtension:
    """Mixed into vLLM's worker class (worker_extension_cls): runs in the worker process."""

    def parity_load_weights(self, blob: bytes, tied: bool, aligned: bool) -> int:
        from safetensors.torch import load

        state = load(blob)
        if aligned:  # parity's decoder: its own all-or-nothing load, no repacking
            self.model_runner.get_model().load_weights(state.items())  # type: ignore[attr-defined]
            return len(state)
        if tied and "lm_head.weight" not in state:
            # vLLM on CPU keeps its own copy of a tied head: reloading the embedding alone
            # would leave the logits on the old weights
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        # in place, through vLLM's reload path: on CPU the loaded weights are repacked, so
        # the model's own load_weights no longer finds their loaders
        self.model_runner.reload_weights(weights_iterator=iter(state.items()))  # type: ignore[attr-defined]
        return len(state)

    def parity_attach(self) -> None:
        """Let parity's decoder see the request ids of each step's batch, in batch order (it
        keeps the running batch's keys dense between steps of the same requests)."""
        runner = self.model_runner  # type: ignore[attr-defined]
        runner.get_model().request_ids = lambda: runner.input_batch.req_ids

    def parity_keep_seeded_draws(self) -> None:
        """vLLM 0.32 on the CPU: at a step that prefills only part of a seeded request's
        prompt (chunked prefill), vLLM samples a token it discards and rewinds the request's
        generator with `set_offset`, which a CPU generator refuses: the engine died ("CPU
        Generator does not use offset") as soon as concurrent seeded prompts passed one
        step's token budget. Here each such request's generator is saved before the step's
        draw and restored after it, and kept out of vLLM's rewind: the rewind vLLM means, so
        a seeded request draws the same tokens however its prompt was chunked."""
        import numpy as np

        runner = self.model_runner  # type: ignore[attr-defined]
        if runner.device.type != "cpu":  # a GPU generator rewinds by its offset
            return
        sample, bookkeeping = runner._sample, runner._bookkeeping_sync

        def discarded() -> list[int]:
            batch = runner.input_batch
            return [int(i) for i in np.nonzero(runner.discard_request_mask.np[:batch.num_reqs])[0]
                    if int(i) in batch.generators]

        def sample_keeping_draws(*args, **kwargs):
            gens = runner.input_batch.generators
            saved = {i: gens[i].get_state() for i in discarded()}
            out = sample(*args, **kwargs)
            for i, state in saved.items():
                gens[i].set_state(state)
            return out

        def bookkeeping_without_rewind(*args, **kwargs):
            gens = runner.input_batch.generators
            hidden = {i: gens.pop(i) for i in discarded()}
            try:
                return bookkeeping(*args, **kwargs)
            finally:
                gens.update(hidden)

        runner._sample, runner._bookkeeping_sync = sample_keeping_draws, bookkeeping_without_rewind

    def parity_probe(self) -> dict:
        """This worker's proof and fingerprint of parity's aligned kernels (aligned only)."""
        from parity.model.selfcheck import probe

        return probe(self.model_runner.get_model().config)  # type: ignore[attr-defined]


def checkpoint_header(model_dir: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of every tensor in the checkpoint, read from the headers."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                out[name] = (meta["dtype"], tuple(meta["shape"]))
    return out


def blob_header(blob: bytes) -> dict[str, tuple[str, tuple[int, ...]]]:
    if len(blob) < 8:
        raise ValueError("the weights body is not a safetensors file (under 8 bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError("the weights body is not a safetensors file (header past the end)")
    header = json.loads(blob[8:8 + n])
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"}


def weight_mismatch(expected: dict[str, tuple[str, tuple[int, ...]]],
                    got: dict[str, tuple[str, tuple[int, ...]]], tied: bool,
                    dtype: str) -> str | None:
    """Why `got` cannot replace the checkpoint's weights (its names and shapes, in the
    engine's dtype `dtype`, a safetensors code), or None."""
    allowed = set(expected) | ({"lm_head.weight"} if tied else set())
    unknown = sorted(set(got) - allowed)
    if unknown:
        return f"unknown tensors {unknown[:3]} (the checkpoint has no such names)"
    missing = sorted(set(expected) - set(got))
    if missing:
        return f"missing tensors {missing[:3]} ({len(missing)} in all)"
    for name, (got_dtype, shape) in got.items():
        if name not in expected:
            continue
        want_shape = expected[name][1]
        if shape != want_shape:
            return f"{name}: shape {list(shape)}, the model's is {list(want_shape)}"
        if got_dtype != dtype:
            return f"{name}: dtype {got_dtype}, the engine's is {dtype}"
    return None


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.model_dir = Path(args.model)
        config = json.loads((self.model_dir / "config.json").read_text())
        self.tied = bool(config.get("tie_word_embeddings", False))
        self.vocab_size = int(config["vocab_size"])
        self.dead = False  # vLLM's engine died: the server stops (the client sees it exit)
        self.expected = checkpoint_header(self.model_dir)
        self.dtype = SAFETENSORS_DTYPES[args.dtype]
        # a model directory without a tokenizer (a random shape) serves token ids only
        self.has_tokenizer = (self.model_dir / "tokenizer.json").is_file()
        self.aligned = args.aligned
        aligned: dict = {}
        if args.aligned:
            import vllm

            from parity.vllm_plugin import aligned_architecture, check_vllm_version

            check_vllm_version(vllm.__version__)  # PluginError: rebuild the environment
            # parity's decoder under vLLM's scheduler, on blocks of one key tile (64): the
            # gathering fallback needs blocks that divide a tile, and the fused kernel, which
            # takes whole tiles per block too, ran no faster on vLLM's CPU default of 128
            aligned = {"hf_overrides": {"architectures": [
                aligned_architecture((config.get("architectures") or ["?"])[0])]},
                "block_size": 64}
        engine_args = AsyncEngineArgs(
            skip_tokenizer_init=not self.has_tokenizer,
            model=str(self.model_dir), dtype=args.dtype, seed=args.seed,
            max_model_len=args.max_model_len, enforce_eager=args.enforce_eager,
            enable_prefix_caching=True, logprobs_mode="processed_logprobs",
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
            num_gpu_blocks_override=args.num_kv_blocks,
            worker_extension_cls="parity_vllm_server.ParityWorkerExtension", **aligned,
        )
        self.engine = AsyncLLM.from_engine_args(engine_args)
        self.probe: dict | None = None  # set by start() when aligned
        self.max_model_len = self.engine.model_config.max_model_len
        self.version = 0
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.open = asyncio.Event()  # cleared while weights load: new requests wait
        self.open.set()
        self.update_lock = asyncio.Lock()

    def sampling(self, req: dict, prompt_len: int):
        from vllm import SamplingParams

        room = self.max_model_len - prompt_len
        stops = list(req.get("stop_strings", []))
        if stops and not self.has_tokenizer:
            raise ValueError("stop_strings need a model directory with a tokenizer")
        return SamplingParams(
            temperature=float(req.get("temperature", 1.0)), top_p=float(req.get("top_p", 1.0)),
            top_k=int(req.get("top_k", 0)) or -1,
            max_tokens=min(int(req.get("max_new_tokens", 256)), room),
            stop_token_ids=list(req.get("stop_token_ids", [])), stop=stops or None,
            include_stop_str_in_output=True, ignore_eos=True, seed=req.get("seed"),
            logprobs=0, detokenize=bool(stops), skip_special_tokens=False,
        )

    async def start(self) -> None:
        """What runs once the engine is up: seeded draws kept through chunked prefill, and
        the aligned worker's probe."""
        await self.engine.collective_rpc("parity_keep_seeded_draws")
        if self.aligned:
            await self.engine.collective_rpc("parity_attach")
            (self.probe,) = await self.engine.collective_rpc("parity_probe")

    async def generate(self, req: dict) -> dict:
        from vllm.inputs import TokensPrompt

        prompt = req.get("prompt_ids")
        if not isinstance(prompt, list) or not prompt:
            raise ValueError("prompt_ids: a non-empty list of token ids is needed")
        # vLLM does not check token ids: one out of range kills its engine
        for name, ids in (("prompt", prompt), ("stop_token_ids", req.get("stop_token_ids", []))):
            for i, t in enumerate(ids):
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                    raise ValueError(f"{name}[{i}] = {t!r} is not a token id in "
                                     f"[0, {self.vocab_size})")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt has {len(prompt)} tokens; the context holds "
                             f"{self.max_model_len}, so a prompt may have at most "
                             f"{self.max_model_len - 1}")
        params = self.sampling(req, len(prompt))
        await self.open.wait()
        self.in_flight += 1
        self.idle.clear()
        version = self.version
        try:
            final = None
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt), params,
                                                  request_id=uuid.uuid4().hex):
                final = out
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()
        assert final is not None
        c = final.outputs[0]
        ids = list(c.token_ids)
        logprobs = [float(lp[t].logprob) for t, lp in zip(ids, c.logprobs or [], strict=True)]
        return {"token_ids": ids, "logprobs": logprobs, "version": version,
                "finish_reason": c.finish_reason or "length",
                "cached_tokens": int(final.num_cached_tokens or 0)}

    async def load_weights(self, blob: bytes, version: int) -> dict:
        why = weight_mismatch(self.expected, blob_header(blob), self.tied, self.dtype)
        if why is not None:
            raise ValueError(f"weights refused: {why}")
        async with self.update_lock:
            t0 = time.perf_counter()
            self.open.clear()
            try:
                await self.idle.wait()
                t1 = time.perf_counter()
                await self.engine.collective_rpc("parity_load_weights",
                                                 args=(blob, self.tied, self.aligned))
                await self.engine.reset_prefix_cache()
                self.version = version
            finally:
                self.open.set()
            return {"version": version, "drain_s": t1 - t0, "load_s": time.perf_counter() - t1}


def preemptions() -> int:
    """vLLM's count of preempted sequences (its Prometheus counter, in this process)."""
    from prometheus_client import REGISTRY

    return int(sum(s.value for m in REGISTRY.collect() for s in m.samples
                   if s.name == "vllm:num_preemptions_total"))


def make_app(server: Server, stop: Callable[[], None]):
    import vllm
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI()

    async def answer(coro) -> JSONResponse:
        try:
            return JSONResponse(await coro)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        except Exception as e:  # the client shows it
            if type(e).__name__ == "EngineDeadError":  # nothing more can run here
                server.dead = True
                stop()
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=500)

    @app.get("/health")
    async def health() -> dict:
        return {"version": server.version, "model": str(server.model_dir),
                "max_model_len": server.max_model_len, "vllm": vllm.__version__,
                "aligned": server.aligned, "probe": server.probe,
                "preemptions": preemptions()}

    @app.post("/generate")
    async def generate(request: Request) -> JSONResponse:
        return await answer(server.generate(await request.json()))

    @app.post("/weights")
    async def weights(request: Request) -> JSONResponse:
        version = int(request.headers.get("x-parity-version", "-1"))
        return await answer(server.load_weights(await request.body(), version))

    return app


def guard_group(shm_list: Path) -> None:
    """Fork a process whose only job is to outlive this server: when the server dies, even
    by SIGKILL, it removes the shared memory the group holds (`shm_list`, see
    `record_shared_memory`) and kills the server's process group, so vLLM's engine core and
    worker (which do not notice their parent's death) are not left holding memory. Forked
    before vLLM and torch are imported."""
    server = os.getpid()
    if os.fork() == 0:
        while os.getppid() == server:
            time.sleep(1.0)
        remove_shared_memory(shm_list)
        os.killpg(0, signal.SIGKILL)


def remove_shared_memory(shm_list: Path) -> None:
    """Unlink the /dev/shm files `shm_list` names (`record_shared_memory`), those still there:
    each is freed once the last process unmaps it. The server's guard and its client both
    call this (a group killed with its guard leaves it to the client)."""
    with contextlib.suppress(OSError):
        for name in shm_list.read_text().split():
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")


def record_shared_memory(shm_list: Path) -> None:
    """Write the names of the /dev/shm files the processes of this group map to `shm_list`.
    vLLM's message queues (two of 160 and 240 MB) and multiprocessing's semaphores live
    there; the group is killed at the end, its resource tracker with it, so nothing else
    would remove them: each server's start left 400 MB of RAM behind."""
    names: set[str] = set()
    group = os.getpgid(0)
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        with contextlib.suppress(OSError):
            if os.getpgid(pid) != group:
                continue
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                    path = fields[5].strip() if len(fields) == 6 else ""
                    if path.startswith("/dev/shm/"):
                        names.add(path.removeprefix("/dev/shm/").removesuffix(" (deleted)"))
    tmp = shm_list.with_suffix(".tmp")
    tmp.write_text("".join(f"{n}\n" for n in sorted(names)))
    tmp.replace(shm_list)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--uds", required=True, help="Unix socket to serve on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(SAFETENSORS_DTYPES), default="float32",
                   help="weights, activations and KV (published weights must match)")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens one engine step may process (small: chunked prefill forced)")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV cache blocks (small: sequences are preempted and recomputed)")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--aligned", action="store_true",
                   help="run parity's decoder (the parity.vllm_plugin package): logprobs "
                        "bit-identical to parity's learner")
    p.add_argument("--parent-pid", type=int, default=0,
                   help="stop when this process is gone (the rollout worker that started it)")
    args = p.parse_args()
    shm_list = Path(args.uds).with_name("shared-memory")
    guard_group(shm_list)

    import uvicorn

    async def serve() -> None:
        server = Server(args)
        await server.start()
        record_shared_memory(shm_list)
        app = make_app(server, lambda: setattr(http, "should_exit", True))
        http = uvicorn.Server(uvicorn.Config(app, uds=args.uds, log_level="warning",
                                             timeout_keep_alive=600))

        async def watch_parent() -> None:
            while os.getppid() == args.parent_pid:  # reparented: the parent died
                await asyncio.sleep(1.0)
            http.should_exit = True

        watcher = asyncio.create_task(watch_parent()) if args.parent_pid else None
        try:
            await http.serve()
        finally:
            if watcher is not None:
                watcher.cancel()
            record_shared_memory(shm_list)  # again: what the engine made since the start
            server.engine.shutdown()
        if server.dead:
            raise SystemExit("vLLM's engine died (its error is above)")

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    asyncio.run(serve())


if __name__ == "__main__":
    main()
