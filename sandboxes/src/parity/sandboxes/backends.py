"""Choosing a backend by name (for the code sandbox or any guest program), and finding out
which backends work on this machine."""

from __future__ import annotations

from typing import Any

from parity.sandboxes.guest import Guest, GuestSpec
from parity.sandboxes.limits import Limits
from parity.sandboxes.result import SandboxError
from parity.sandboxes.sandbox import Sandbox

BACKENDS = ("local", "docker")


def open_sandbox(backend: str = "local", limits: Limits | None = None, **options: Any) -> Sandbox:
    """Start a sandbox of `backend` ("local" or "docker"); `options` go to its constructor
    (docker: image=, client=). Raises SandboxError saying how to fix a missing backend."""
    if backend == "local":
        from parity.sandboxes.local import LocalSandbox

        return LocalSandbox(limits, **options)
    if backend == "docker":
        from parity.sandboxes.docker_backend import DockerSandbox

        return DockerSandbox(limits, **options)
    raise SandboxError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def launch_guest(backend: str, spec: GuestSpec, **options: Any) -> Guest:
    """Start `spec`'s program in a sandbox of `backend` ("local" or "docker") with the same
    isolation as the code sandbox; `options` go to the guest's constructor (docker: client=)."""
    if backend == "local":
        from parity.sandboxes.local import LocalGuest

        return LocalGuest(spec, **options)
    if backend == "docker":
        from parity.sandboxes.docker_backend import DockerGuest

        return DockerGuest(spec, **options)
    raise SandboxError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def check_backends() -> dict[str, str | None]:
    """For each backend: None when a sandbox starts and runs `python3 -c 'print(1)'` here,
    else why not. Local also says when it falls back to rlimits for lack of cgroups."""
    from parity.sandboxes.cgroups import cgroup_support

    report: dict[str, str | None] = {}
    for name in BACKENDS:
        try:
            with open_sandbox(name, Limits(timeout_s=30)) as sb:
                r = sb.run_python("print(1)")
            report[name] = None if r.stdout == "1\n" else f"print(1) gave {r.to_json()}"
        except SandboxError as exc:
            report[name] = str(exc)
    if report["local"] is None and (why := cgroup_support()) is not None:
        report["local"] = None
        report["local_note"] = f"works, with per-process rlimits instead of cgroups: {why}"
    return report
