"""Fixtures: a sandbox per backend (docker tests skip when no engine answers, unless
PARITY_REQUIRE_DOCKER=1, as in CI, turns that into a failure) and a host-side process scan."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from parity.sandboxes import Limits, Sandbox, open_sandbox

# Small limits so hostile programs hit them fast.
SMALL = Limits(timeout_s=3, cpu_s=5, memory_mb=128, max_procs=32, output_bytes=4096, disk_mb=16)

BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


def docker_unavailable() -> str | None:
    from parity.sandboxes.docker_backend import DEFAULT_IMAGE, docker_client

    try:
        client = docker_client()
        client.images.get(DEFAULT_IMAGE)
    except Exception as exc:
        return str(exc)
    return None


def require_backend(name: str) -> None:
    if name == "docker" and (why := docker_unavailable()) is not None:
        if os.environ.get("PARITY_REQUIRE_DOCKER") == "1":
            pytest.fail(f"PARITY_REQUIRE_DOCKER=1 but docker is unusable: {why}")
        pytest.skip(f"docker backend unusable here: {why}")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    require_backend(request.param)
    return request.param


@pytest.fixture
def sb(backend: str) -> Iterator[Sandbox]:
    sandbox = open_sandbox(backend, SMALL)
    yield sandbox
    sandbox.close()


@pytest.fixture
def docker_ready() -> None:
    require_backend("docker")


@pytest.fixture
def token() -> str:
    """A unique string to put in a hostile program's command line, to find its processes."""
    return f"parity-token-{uuid.uuid4().hex}"


@pytest.fixture
def survivors(token: str) -> Callable[[], list[int]]:
    """Pids, seen from the host, whose command line holds this test's `token`."""
    return lambda: host_processes_with(token)


def host_processes_with(token: str) -> list[int]:
    """Pids, seen from the host, whose command line contains `token` (sandboxed processes
    of both backends share this kernel and are visible here)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(entry.name))
    return found
