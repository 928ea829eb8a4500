"""Math answer checking with Hugging Face `math-verify`, made safe for a rollout worker.

`math-verify` times out with `signal.alarm`, which only works in the main thread, so its own
timeouts are disabled and every check runs in a worker process with a hard timeout instead:
a check that runs over is scored wrong, counted, and its worker is killed and replaced.
Answers longer than `max_chars` are refused before parsing (sympy can hang on huge input).
`verify` is asymmetric; the gold answer always goes first.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """`correct`: the answer equals the gold one. `status`: "ok", "timeout" (the check ran
    past the hard timeout), "too_long" (over the character cap) or "error" (it crashed)."""

    correct: bool
    status: str = "ok"


def _load() -> None:
    """Worker initializer: import math-verify (seconds: sympy) before any timed check."""
    import math_verify  # noqa: F401

    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _ping() -> None:
    """A no-op task; its return means a worker has started and run `_load`."""


def _check(gold: str, answer: str) -> bool:
    """Runs in a worker process: math-verify with its signal-based timeouts off."""
    from math_verify import parse, verify

    g = parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
    p = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
    return bool(verify(g, p, timeout_seconds=None))


class MathVerifier:
    """Checks answers against gold answers in a pool of `workers` processes.

    `timeout_s` bounds one check; starting the workers (importing sympy) is not counted
    against it but against `startup_timeout_s`.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        max_chars: int = 1000,
        workers: int = 1,
        startup_timeout_s: float = 300.0,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        self.workers = workers
        self.startup_timeout_s = startup_timeout_s
        self._pool: ProcessPoolExecutor | None = None
        self._warmup: list[Future] = []
        self._lock = threading.Lock()

    async def _get_pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # Forking this process (threads: asyncio, Ray) is unsafe; the forkserver is
                # single-threaded and has math-verify imported, so replacing a killed
                # worker takes milliseconds, not the seconds of a fresh sympy import.
                ctx = multiprocessing.get_context("forkserver")
                ctx.set_forkserver_preload(["math_verify", "parity.envs.verifier"])
                self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_load)
                # one task per worker: each submit starts a worker while none is idle
                self._warmup = [self._pool.submit(_ping) for _ in range(self.workers)]
            pool, warmup = self._pool, self._warmup
        waits = [asyncio.shield(asyncio.wrap_future(f)) for f in warmup]
        await asyncio.wait_for(asyncio.gather(*waits), self.startup_timeout_s)
        return pool

    def _kill_pool(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        # A hung worker never returns; kill it rather than wait for it.
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    async def verify(self, gold: str, answer: str) -> Verdict:
        """Whether `answer` (the content of a \\boxed{}) equals `gold`. Never raises."""
        if len(answer) > self.max_chars or len(gold) > self.max_chars:
            return Verdict(False, "too_long")
        loop = asyncio.get_running_loop()
        for attempt in range(2):  # one retry if another check's timeout killed the pool
            try:
                pool = await self._get_pool()
            except (TimeoutError, BrokenProcessPool):
                log.exception("math-verify workers did not start")
                return Verdict(False, "error")
            try:
                fut = loop.run_in_executor(pool, _check, gold, answer)
                return Verdict(await asyncio.wait_for(fut, self.timeout_s))
            except TimeoutError:
                log.warning("math-verify timed out after %.3gs on %r", self.timeout_s, answer[:80])
                self._kill_pool(pool)
                return Verdict(False, "timeout")
            except BrokenProcessPool:
                self._kill_pool(pool)
                if attempt:
                    return Verdict(False, "error")
            except Exception:
                log.exception("math-verify failed on %r", answer[:80])
                return Verdict(False, "error")
        return Verdict(False, "error")

    def close(self) -> None:
        """Stop the worker processes; the verifier restarts them when used again."""
        if self._pool is not None:
            self._kill_pool(self._pool)


_default: MathVerifier | None = None


def default_verifier() -> MathVerifier:
    """The process-wide verifier shared by Math envs that are not given their own."""
    global _default
    if _default is None:
        _default = MathVerifier()
    return _default
