"""The engine's front: requests in (validated, with futures), token ids + recorded
logprobs + policy versions out.

One `step()` is three calls: `Scheduler.schedule` (which rows compute next),
`ModelRunner.run` (one `Decoder.forward` over them, KV in the paged pool, and the next
token of each sequence that reached the end of its tokens) and `postprocess` (append, stop,
release). The logprob recorded for a token is read straight off
`model.logprobs(hidden, temperature)`, the learner's own function, so in aligned kernel
mode it is bit-identical to `token_logprobs` for the same weights and tokens.

Weight updates: `update_weights` swaps all weights between steps, bumps the version,
clears the prefix cache and sends every in-flight sequence back to recompute its K/V under
the new weights (preemption by recompute). Their earlier tokens keep the versions that
produced them; every later token is computed entirely by the new weights, so its recorded
logprob equals the learner's under those weights, bit for bit.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from contextlib import nullcontext

import torch

from parity.core.timing import DECODE, PREFILL, StateClock
from parity.core.types import Completion, SamplingParams
from parity.engine.block_manager import BlockManager
from parity.engine.config import EngineConfig
from parity.engine.model_runner import ModelRunner
from parity.engine.postprocess import postprocess
from parity.engine.scheduler import Scheduler
from parity.engine.sequence import Sequence, Status
from parity.engine.stopping import Detokenizer
from parity.engine.weights import apply_update, check_update
from parity.model import Decoder

LOOP_TURNS_AFTER_FINISH = 8


class EngineInputError(ValueError):
    """A request the engine refuses (bad prompt or sampling parameters); nothing was queued."""


class Engine:
    def __init__(
        self,
        model: Decoder,
        config: EngineConfig | None = None,
        tokenizer: Detokenizer | None = None,
    ) -> None:
        self.config = config = config or EngineConfig()
        self.tokenizer = tokenizer
        self.version = 0
        cfg = model.config
        self.vocab_size = cfg.vocab_size
        limit = config.max_model_len or cfg.max_position_embeddings
        self.max_len = min(limit, config.kv_blocks * config.block_size)
        self.runner = ModelRunner(model, config.kv_blocks, config.block_size, config.dense_kv_mib)
        self.blocks = BlockManager(config.kv_blocks, config.block_size, config.prefix_caching)
        self.scheduler = Scheduler(config, self.blocks, cfg.num_attention_heads, cfg.kv_heads)
        self._ids = itertools.count()
        self._rng = random.Random(self.config.seed)
        self._lock = threading.RLock()
        self._futures: dict[int, asyncio.Future[Completion]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self.num_steps = 0
        self.state_clock: StateClock | None = None  # a rollout worker's: steps mark themselves

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens whose K/V came from the prefix cache instead of a forward."""
        return self.scheduler.num_cached_tokens

    # ------------------------------------------------------------------ requests

    def make_sequence(self, prompt: Seq[int], sampling: SamplingParams) -> Sequence:
        """Validate one request; raises EngineInputError naming the bad field."""
        if not isinstance(sampling, SamplingParams):
            raise EngineInputError(
                f"sampling must be a SamplingParams, got {type(sampling).__name__}"
            )
        tokens = list(prompt)
        if not tokens:
            raise EngineInputError("prompt is empty: at least one token id is needed")
        for i, t in enumerate(tokens):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise EngineInputError(
                    f"prompt[{i}] = {t!r} is not a token id in [0, {self.vocab_size})"
                )
        if len(tokens) >= self.max_len:
            raise EngineInputError(
                f"prompt has {len(tokens)} tokens; the context holds {self.max_len}, "
                f"so a prompt may have at most {self.max_len - 1}"
            )
        bad = [t for t in sampling.stop_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise EngineInputError(
                f"stop_token_ids {bad} are not token ids in [0, {self.vocab_size})"
            )
        self._check_stop_strings(sampling.stop_strings)
        seed = sampling.seed if sampling.seed is not None else self._rng.getrandbits(63)
        return Sequence(next(self._ids), tokens, sampling, seed % 2**64, self.max_len)

    def _check_stop_strings(self, stops: tuple[str, ...]) -> None:
        if not stops:
            return
        if self.tokenizer is None:
            raise EngineInputError("stop_strings need an engine built with a tokenizer")
        encode = getattr(self.tokenizer, "encode", None)
        for s in stops:
            if encode is not None and self.tokenizer.decode(encode(s)) != s:
                raise EngineInputError(f"stop string {s!r} cannot be produced by this tokenizer")

    def add(self, seq: Sequence) -> None:
        with self._lock:
            self.scheduler.add(seq)

    def abort(self, seq: Sequence) -> None:
        with self._lock:
            if seq.status is not Status.FINISHED:
                self.scheduler.finish(seq, "abort")

    # ------------------------------------------------------------------ sync API

    def generate(
        self, prompts: Seq[Seq[int]], sampling: SamplingParams | Seq[SamplingParams] | None = None
    ) -> list[Completion]:
        """Run the prompts to completion, batched together; one Completion per prompt."""
        sampling = sampling or SamplingParams()
        params = (
            [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
        )
        if len(params) != len(prompts):
            raise EngineInputError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        seqs = []
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
            try:
                seqs.append(self.make_sequence(p, sp))
            except EngineInputError as e:
                raise EngineInputError(f"request {i}: {e}") from None
        for seq in seqs:
            self.add(seq)
        try:
            while any(s.status is not Status.FINISHED for s in seqs):
                self.step()
        except BaseException:
            for s in seqs:
                self.abort(s)
            raise
        return [s.completion() for s in seqs]

    # ------------------------------------------------------------------ asyncio API

    async def agenerate(
        self, prompt_ids: Seq[int], sampling: SamplingParams | None = None
    ) -> Completion:
        """One request; concurrent calls on the same event loop are batched together."""
        seq = self.make_sequence(prompt_ids, sampling or SamplingParams())
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Completion] = loop.create_future()
        self._futures[seq.seq_id] = fut
        self.add(seq)
        task = self._loop_task
        if task is None or task.done() or task.get_loop() is not loop:
            self._loop_task = loop.create_task(self._run())
        try:
            return await fut
        except asyncio.CancelledError:
            self.abort(seq)
            raise
        finally:
            self._futures.pop(seq.seq_id, None)

    async def _run(self) -> None:
        while self.scheduler.has_work():
            try:
                finished = self.step()
            except Exception as e:  # a bug must fail the requests, not hang or kill the loop
                self._fail_all(e)
                return
            # A step holds the loop. After one that finished requests, a few turns of the
            # loop (each polls the sockets) let their answers reach callers that wait over
            # HTTP (an agent's endpoint: read, answer, send the next call) and those calls
            # join the next step, instead of each hop waiting behind a step of its own.
            for _ in range(LOOP_TURNS_AFTER_FINISH if finished else 1):
                await asyncio.sleep(0)

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            for seq in [*self.scheduler.running, *self.scheduler.waiting]:
                self.scheduler.finish(seq, "abort")
                fut = self._futures.get(seq.seq_id)
                if fut is not None and not fut.done():
                    fut.set_exception(error)

    # ------------------------------------------------------------------ weights

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Install new weights between steps; a bad update raises and changes nothing."""
        with self._lock:
            check_update(self.runner.model, state, version)
            apply_update(self.runner.model, state)
            self.version = version
            self.runner.dense.forget()
            self.blocks.clear_cache()
            self.scheduler.preempt_all()

    # ------------------------------------------------------------------ the step

    def step(self) -> list[Sequence]:
        """One forward call over the scheduled rows; returns the sequences that finished."""
        with self._lock:
            batch = self.scheduler.schedule()
            if not batch.seqs:
                return []
            self.num_steps += 1
            kind = DECODE if all(n == 1 for n in batch.num_new) else PREFILL
            with self.state_clock.during(kind) if self.state_clock else nullcontext():
                sampled = self.runner.run(batch)
                finished = postprocess(self.scheduler, batch, sampled, self.version,
                                       self.tokenizer)
            for seq in finished:
                fut = self._futures.get(seq.seq_id)
                if fut is not None and not fut.done():
                    fut.set_result(seq.completion())
            return finished
