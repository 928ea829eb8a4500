"""parity.sandboxes: isolated execution of model-written code.

    from parity.sandboxes import Limits, open_sandbox
    with open_sandbox("local", limits=Limits(timeout_s=5)) as sb:
        r = sb.run_python("print(1)")      # ExecResult(exit_code=0, stdout="1\\n", ...)

Backends: "local" (bubblewrap + cgroups or rlimits) and "docker" (docker SDK). SandboxPool
keeps warm sandboxes for repeated use. `launch_guest(backend, GuestSpec(...))` runs any other
program (a server reached through a socket folder, say) with the same isolation.
"""

from parity.sandboxes.backends import BACKENDS, check_backends, launch_guest, open_sandbox
from parity.sandboxes.guest import Bind, Guest, GuestSpec
from parity.sandboxes.limits import Limits
from parity.sandboxes.pool import SandboxPool
from parity.sandboxes.result import ExecResult, SandboxError, SandboxInputError
from parity.sandboxes.sandbox import PythonSession, Sandbox

__all__ = [
    "BACKENDS",
    "Bind",
    "ExecResult",
    "Guest",
    "GuestSpec",
    "Limits",
    "PythonSession",
    "Sandbox",
    "SandboxError",
    "SandboxInputError",
    "SandboxPool",
    "check_backends",
    "launch_guest",
    "open_sandbox",
]
