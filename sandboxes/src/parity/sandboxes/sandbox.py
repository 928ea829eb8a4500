"""The Sandbox protocol every backend implements, on top of the in-sandbox helper.

A backend only starts the helper (helper.py) isolated and knows how to destroy everything it
started; running commands, files and sessions are the same code for all backends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any, Self

from parity.sandboxes.limits import Limits
from parity.sandboxes.protocol import Transport, encode, read_frame
from parity.sandboxes.result import ExecResult, SandboxError, SandboxInputError

# Seconds the host waits beyond a call's own timeout before declaring the helper hung.
REPLY_MARGIN_S = 10.0
# Largest single `python3 -c` argument the kernel accepts is 128 KiB (MAX_ARG_STRLEN).
MAX_ARG_BYTES = 128 * 1024 - 1
DEFAULT_READ_BYTES = 1 << 20


class Threads:
    """The worker threads behind one owner's asyncio API (a sandbox's, a pool's): every call
    blocks a thread for its whole duration, and the event loop's default executor (CPUs + 4
    threads) is shared with everything else. Started on first use, stopped by `close()`."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._max_workers, self._name = max_workers, name
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            if self._closed:
                pool = None
            elif self._pool is None:
                self._pool = pool = ThreadPoolExecutor(self._max_workers, self._name)
            else:
                pool = self._pool
        if pool is None:  # the owner is closed: its calls fail (or return) at once
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    def close(self) -> None:
        """Stop the threads once their current calls end (callable from one of them)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)


class Closing:
    """`close()` (idempotent) plus the context-manager and asyncio forms every holder of
    sandboxes offers: `with`, `async with`, `await aclose()`. `_threads` runs the blocking
    calls of the asyncio forms; `close()` must close it."""

    _threads: Threads

    def close(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        await self._threads.run(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def helper_argv(python: str, limits: dict[str, Any]) -> list[str]:
    """The command that starts the helper inside a sandbox: its source, the REPL's and the
    limits it applies (Limits fields plus the backend's rlimit_nproc choice)."""
    pkg = resources.files("parity.sandboxes")
    helper = pkg.joinpath("helper.py").read_text()
    repl = pkg.joinpath("repl.py").read_text()
    return [python, "-I", "-S", "-c", helper, repl, json.dumps(limits)]


def _check_argv(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, str | bytes) or not argv:
        raise SandboxInputError(
            "argv must be a non-empty list of strings, e.g. ['python3', '-c', 'print(1)']"
        )
    out = []
    for i, arg in enumerate(argv):
        if not isinstance(arg, str):
            raise SandboxInputError(f"argv[{i}] is {type(arg).__name__}, not str")
        if "\0" in arg:
            raise SandboxInputError(f"argv[{i}] contains a NUL byte, which no command line can carry")
        if len(arg.encode("utf-8", "surrogateescape")) > MAX_ARG_BYTES:
            raise SandboxInputError(
                f"argv[{i}] is over 128 KiB, the kernel's limit for one argument; "
                "write it to a file with write_file() and run that instead"
            )
        out.append(arg)
    return out


def _decode(b64: str) -> str:
    return base64.b64decode(b64).decode("utf-8", errors="replace")


class Sandbox(Closing, ABC):
    """An isolated place to run commands, Python snippets and Python sessions.

    Calls on one sandbox are serialised (a lock); use a SandboxPool for concurrency.
    `close()` is idempotent and kills every process the sandbox started.
    """

    backend: str = ""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._lock = threading.RLock()
        self._transport: Transport | None = None
        self._dead: str | None = None  # why the sandbox can no longer be used
        self._closed = False
        self.breaches = 0  # calls that hit a limit or failed; pools recycle such sandboxes
        # Calls on a sandbox are serialised anyway, so one thread serves its asyncio API.
        self._threads = Threads(1, "parity-sandbox-call")

    # -- what a backend provides -------------------------------------------------------
    @abstractmethod
    def _destroy(self) -> None:
        """Kill every process of the sandbox and free what it holds; safe to call twice."""

    def _host_oom_kills(self) -> int:
        """OOM kills the host sees for this sandbox (its cgroup); 0 when it cannot see any."""
        return 0

    # -- the protocol ------------------------------------------------------------------
    def _connect(self, transport: Transport, start_timeout_s: float) -> None:
        """Adopt the helper's stream and wait for its first answer (the caller closes on error)."""
        self._transport = transport
        self._request({"op": "ping"}, start_timeout_s)

    def _request(self, req: dict[str, Any], wait_s: float) -> dict[str, Any]:
        with self._lock:
            if self._closed:
                raise SandboxError(f"this {self.backend} sandbox is closed; open a new one")
            if self._dead is not None:
                raise SandboxError(f"this {self.backend} sandbox is unusable: {self._dead}")
            assert self._transport is not None
            try:
                self._transport.send(encode(req))
                reply = read_frame(self._transport, time.monotonic() + wait_s)
            except (OSError, EOFError, TimeoutError, ValueError) as exc:
                self._dead = f"its helper process failed ({exc}); open a new sandbox"
                self._destroy()
                raise SandboxError(f"{self.backend} sandbox failed: {self._dead}") from exc
        if not reply.get("ok"):
            raise SandboxError(f"{self.backend} sandbox refused {req['op']}: {reply.get('error')}")
        return reply

    def _result(self, reply: dict[str, Any], oom_before: int) -> ExecResult:
        result = ExecResult(
            exit_code=reply["exit_code"],
            stdout=_decode(reply["stdout"]),
            stderr=_decode(reply["stderr"]),
            timed_out=reply["timed_out"],
            oom=reply["oom"] or self._host_oom_kills() > oom_before,
            output_truncated=reply["output_truncated"],
            duration_s=reply["duration_s"],
            error=reply.get("error"),
        )
        self.breaches += result.breached
        return result

    def _timeout(self, timeout_s: float | None) -> float:
        if timeout_s is None:
            return self.limits.timeout_s
        if not timeout_s > 0:
            raise SandboxInputError(f"timeout_s must be > 0, got {timeout_s!r}")
        return float(timeout_s)

    # -- public API --------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """Open and its helper has not failed."""
        return not self._closed and self._dead is None

    def ping(self) -> bool:
        """Health check: the helper answers within a few seconds."""
        try:
            self._request({"op": "ping"}, 5.0)
        except SandboxError:
            return False
        return True

    def run(
        self,
        argv: Sequence[str],
        stdin: bytes | str | None = None,
        timeout_s: float | None = None,
    ) -> ExecResult:
        """Run `argv` in the work dir (/work) as an unprivileged user, with the sandbox's limits."""
        args = _check_argv(argv)
        timeout = self._timeout(timeout_s)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        if data is not None and len(data) > self.limits.stdin_bytes:
            raise SandboxInputError(
                f"stdin is {len(data)} bytes, over Limits.stdin_bytes={self.limits.stdin_bytes}; "
                "raise the limit or write the data to a file with write_file()"
            )
        req = {
            "op": "run",
            "argv": args,
            "stdin": None if data is None else base64.b64encode(data).decode(),
            "timeout_s": timeout,
        }
        oom_before = self._host_oom_kills()
        return self._result(self._request(req, timeout + REPLY_MARGIN_S), oom_before)

    def run_python(
        self, code: str, stdin: bytes | str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        """Run a Python snippet with the sandbox's python3 (`python3 -c code`)."""
        return self.run(["python3", "-c", code], stdin=stdin, timeout_s=timeout_s)

    def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file under the work dir (parents created); paths outside it are refused."""
        raw = data.encode() if isinstance(data, str) else data
        if len(raw) > self.limits.disk_mb << 20:
            raise SandboxInputError(
                f"{path}: {len(raw)} bytes is over Limits.disk_mb={self.limits.disk_mb}"
            )
        self._request({"op": "write", "path": path, "data": base64.b64encode(raw).decode()}, 60.0)

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a file under the work dir, at most `max_bytes` (default 1 MiB) of it."""
        cap = DEFAULT_READ_BYTES if max_bytes is None else max_bytes
        if cap < 0:
            raise SandboxInputError(f"max_bytes must be >= 0, got {cap}")
        reply = self._request({"op": "read", "path": path, "max_bytes": cap}, 60.0)
        return base64.b64decode(reply["data"])

    def reset(self) -> None:
        """End every session and process, and empty /work and /tmp (pools do this between uses)."""
        self._request({"op": "reset"}, 30.0)

    def python_session(self) -> PythonSession:
        """A Python interpreter kept alive between calls (state preserved), inside this sandbox."""
        return PythonSession(self)

    async def arun(
        self, argv: Sequence[str], stdin: bytes | str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        return await self._threads.run(self.run, argv, stdin, timeout_s)

    async def arun_python(
        self, code: str, stdin: bytes | str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        return await self._threads.run(self.run_python, code, stdin, timeout_s)

    async def awrite_file(self, path: str, data: bytes | str) -> None:
        await self._threads.run(self.write_file, path, data)

    async def aread_file(self, path: str, max_bytes: int | None = None) -> bytes:
        return await self._threads.run(self.read_file, path, max_bytes)

    def close(self) -> None:
        """Kill everything the sandbox started and free its resources. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._destroy()
                if self._transport is not None:
                    self._transport.close()
            finally:
                self._threads.close()

    def __del__(self) -> None:
        # A forgotten sandbox must not leave processes behind.
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):  # interpreter shutdown may have torn down modules
                self.close()


class PythonSession:
    """A persistent Python REPL process in a sandbox: `run("x = 1")`, then `run("print(x)")`.

    A bare last expression is echoed (like the interactive prompt). If a call times out, hits
    a limit or the code exits, the interpreter is gone: that call's result carries `error`,
    and later calls raise SandboxError.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.sid = uuid.uuid4().hex
        self._ended: str | None = None
        sandbox._request({"op": "session_start", "sid": self.sid}, 30.0)

    def run(self, code: str, timeout_s: float | None = None) -> ExecResult:
        """Execute `code` in the session's namespace."""
        if self._ended is not None:
            raise SandboxError(f"this Python session has ended ({self._ended}); start a new one")
        if not isinstance(code, str):
            raise SandboxInputError(f"code must be str, got {type(code).__name__}")
        timeout = self.sandbox._timeout(timeout_s)
        oom_before = self.sandbox._host_oom_kills()
        req = {"op": "session_run", "sid": self.sid, "code": code, "timeout_s": timeout}
        try:
            reply = self.sandbox._request(req, timeout + REPLY_MARGIN_S)
        except SandboxError as exc:
            self._ended = str(exc)
            raise
        result = self.sandbox._result(reply, oom_before)
        if result.error is not None:
            self._ended = result.error
        return result

    async def arun(self, code: str, timeout_s: float | None = None) -> ExecResult:
        return await self.sandbox._threads.run(self.run, code, timeout_s)

    def close(self) -> None:
        """End the interpreter. Idempotent; a no-op once the sandbox is closed."""
        if self._ended is not None:
            return
        self._ended = "closed"
        if self.sandbox.alive:
            with contextlib.suppress(SandboxError):
                self.sandbox._request({"op": "session_close", "sid": self.sid}, 10.0)

    def __enter__(self) -> PythonSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
