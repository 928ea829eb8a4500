"""What a sandboxed call returns, and the one error the sandboxes raise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class SandboxError(RuntimeError):
    """The sandbox could not do what was asked (backend missing, sandbox dead, bad input).

    The message says what happened and how to fix it.
    """


class SandboxInputError(SandboxError):
    """The request itself was refused (an argument too long, a NUL byte, stdin over its
    limit): the caller's input is at fault, the sandbox is fine and stays usable. An env
    shows this to the model like any tool error; every other SandboxError is the sandbox's.
    """


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command, snippet or session call.

    exit_code: the process's exit status; -N when it was killed by signal N (a timeout,
        the output cap and the OOM killer all kill with SIGKILL: -9).
    stdout, stderr: what it wrote, decoded as UTF-8 with errors="replace", at most
        Limits.output_bytes bytes of both together.
    timed_out: the wall-clock timeout ended it.   oom: it ran out of memory.
    output_truncated: it wrote more than the cap; the call was ended there.
    duration_s: wall-clock seconds inside the sandbox.
    error: None, or why the sandbox (or session) itself failed during the call.
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    oom: bool = False
    output_truncated: bool = False
    duration_s: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Exit code 0 and no flag raised."""
        return self.exit_code == 0 and not (self.timed_out or self.oom or self.output_truncated)

    @property
    def breached(self) -> bool:
        """A limit was hit or the sandbox failed: pools recycle the sandbox after this."""
        return self.timed_out or self.oom or self.output_truncated or self.error is not None

    def to_json(self) -> dict[str, Any]:
        """The JSON view printed by `parity sandbox exec --json`."""
        return {
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "timed_out": self.timed_out,
            "oom": self.oom,
            "output_truncated": self.output_truncated,
            "duration_s": self.duration_s,
        }
