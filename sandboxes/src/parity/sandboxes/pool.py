"""A pool of warm sandboxes: bounded concurrency, health checks, rate-limited creation, recycling.

Each process (e.g. each Ray env worker) builds its own pool: sandboxes hold local processes or
container handles and are never shared across processes or hosts.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from parity.sandboxes.backends import open_sandbox
from parity.sandboxes.limits import Limits
from parity.sandboxes.result import SandboxError
from parity.sandboxes.sandbox import Closing, Sandbox, Threads


class SandboxPool(Closing):
    """Lend sandboxes of one backend, at most `size` at a time.

    size: most sandboxes leased at once (and kept warm).
    max_uses: a sandbox is closed after this many leases; also after any lease in which a
        call hit a limit (timeout, OOM, output cap) or the sandbox failed.
    health_check: ping an idle sandbox before lending it (a dead one is replaced).
    min_create_interval_s: at least this long between two sandbox creations (rate limit).
    acquire_timeout_s: how long a lease waits for a free slot before SandboxError.
    Between leases a sandbox is reset: its processes and sessions end and /work, /tmp empty.
    """

    def __init__(
        self,
        backend: str = "local",
        size: int = 4,
        limits: Limits | None = None,
        max_uses: int = 50,
        health_check: bool = True,
        min_create_interval_s: float = 0.0,
        acquire_timeout_s: float = 300.0,
        **options: Any,
    ) -> None:
        if size < 1 or max_uses < 1:
            raise SandboxError(
                f"size and max_uses must be >= 1, got size={size}, max_uses={max_uses}"
            )
        self.backend, self.size, self.limits = backend, size, limits or Limits()
        self.max_uses, self.health_check = max_uses, health_check
        self.min_create_interval_s, self.acquire_timeout_s = (
            min_create_interval_s,
            acquire_timeout_s,
        )
        self.options = options
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: deque[Sandbox] = deque()
        self._uses: dict[int, int] = {}
        self._next_create = 0.0
        self._closed = False
        # One thread per slot checks sandboxes out and in for `lease()`; the pool closes them
        # when it is closed and the last lease has come back.
        self._threads = Threads(size, "parity-sandbox-pool")
        self._leased = 0
        self.created = 0  # sandboxes created so far
        self.recycled = 0  # sandboxes closed for max_uses, a breach or a failed check

    def warm(self, n: int | None = None) -> None:
        """Start sandboxes until `n` (default `size`) are idle and ready."""
        target = self.size if n is None else min(n, self.size)
        while len(self._idle) < target:
            sb = self._create()
            with self._lock:
                self._idle.append(sb)

    def _create(self) -> Sandbox:
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox pool is closed")
            wait = self._next_create - time.monotonic()
            self._next_create = (
                max(time.monotonic(), self._next_create) + self.min_create_interval_s
            )
        if wait > 0:
            time.sleep(wait)
        sb = open_sandbox(self.backend, self.limits, **self.options)
        self.created += 1
        self._uses[id(sb)] = 0
        return sb

    def _checkout(self) -> Sandbox:
        while True:
            with self._lock:
                if self._closed:
                    raise SandboxError("the sandbox pool is closed")
                sb = self._idle.popleft() if self._idle else None
            if sb is None:
                return self._create()
            if sb.alive and (not self.health_check or sb.ping()):
                return sb
            self._retire(sb)

    def _checkin(self, sb: Sandbox) -> None:
        self._uses[id(sb)] = self._uses.get(id(sb), 0) + 1
        if self._closed or not sb.alive or sb.breaches or self._uses[id(sb)] >= self.max_uses:
            self._retire(sb)
            return
        try:
            sb.reset()
        except SandboxError:
            self._retire(sb)
            return
        with self._lock:
            self._idle.append(sb)

    def _retire(self, sb: Sandbox) -> None:
        self._uses.pop(id(sb), None)
        self.recycled += 1
        sb.close()

    @contextmanager
    def acquire(self) -> Iterator[Sandbox]:
        """`with pool.acquire() as sb:` lends a sandbox for the block."""
        if not self._slots.acquire(timeout=self.acquire_timeout_s):
            raise SandboxError(
                f"no sandbox free within {self.acquire_timeout_s}s (pool size {self.size})"
            )
        try:
            sb = self._checkout()
            try:
                yield sb
            finally:
                self._checkin(sb)
        finally:
            self._slots.release()

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[Sandbox]:
        """`async with pool.lease() as sb:` lends a sandbox without blocking the event loop."""
        deadline = time.monotonic() + self.acquire_timeout_s
        # Poll rather than block a worker thread on the semaphore: blocked threads could
        # starve the very calls that would free a slot.
        while not self._slots.acquire(blocking=False):
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"no sandbox free within {self.acquire_timeout_s}s (pool size {self.size})"
                )
            await asyncio.sleep(0.002)
        with self._lock:
            self._leased += 1
        try:
            sb = await self._threads.run(self._checkout)
            try:
                yield sb
            finally:
                await self._threads.run(self._checkin, sb)
        finally:
            self._slots.release()
            with self._lock:
                self._leased -= 1
                last = self._closed and not self._leased
            if last:
                self._threads.close()

    def close(self) -> None:
        """Close idle sandboxes now and leased ones when they come back. Idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
            leased = self._leased
        for sb in idle:
            sb.close()
        if not leased:
            self._threads.close()
