"""An episode's tools sandbox, held while the episode runs: leased from the rollout worker's
warm pool where it has one (`parity.sandboxes.SandboxPool`), else opened; on release given
back to the pool (which resets or retires it) or closed. The one holder of every env that
runs tools in a sandbox (`PythonToolEnv`, an agent env's `AgentSandbox`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any


class HeldSandbox:
    """`open_sandbox()` (called in a thread: it blocks) makes a sandbox when there is no
    `pool`; either way nothing starts before the first `get`."""

    def __init__(self, open_sandbox: Callable[[], Any], pool: Any = None) -> None:
        self.open_sandbox, self.pool = open_sandbox, pool
        self.sandbox: Any = None  # the one held now, if any
        self._lease: AsyncExitStack | None = None

    async def get(self) -> Any:
        """The held sandbox, leased or opened on first use."""
        if self.sandbox is None and self.pool is not None:
            self._lease = AsyncExitStack()
            self.sandbox = await self._lease.enter_async_context(self.pool.lease())
        elif self.sandbox is None:
            self.sandbox = await asyncio.to_thread(self.open_sandbox)
        return self.sandbox

    async def release(self) -> None:
        """Give the sandbox back (or close it); the next `get` holds a new one."""
        sandbox, lease = self.sandbox, self._lease
        self.sandbox, self._lease = None, None
        if lease is not None:
            await lease.aclose()
        elif sandbox is not None:
            await asyncio.to_thread(sandbox.close)
