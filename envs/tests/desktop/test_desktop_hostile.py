"""The hostile suite for the desktop's own sandbox (its GuestSpec), on the local and the Docker
backend: hostile commands run through the control server's `execute` step are contained
(no network but its socket folder, no host writes outside its binds, limits enforced) and
nothing outlives a killed owner. sandboxes/tests/test_hostile.py checks the same for any guest.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from desktop_support import needs_desktop

from parity.envs.desktop.client import DesktopClient, DesktopRequestError
from parity.envs.desktop.sandbox import IMAGE, DesktopSandbox

pytestmark = [needs_desktop, pytest.mark.timeout(300)]


def _require(backend: str) -> None:
    if backend != "docker":
        return
    try:
        import docker

        docker.from_env(timeout=10).images.get(IMAGE)
    except Exception as e:  # no SDK, engine or image
        if os.environ.get("PARITY_REQUIRE_DOCKER") == "1":
            pytest.fail(f"PARITY_REQUIRE_DOCKER=1 but the desktop cannot run on docker: {e}")
        pytest.skip(f"desktop image unusable here: {e}")


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def desktop(request: pytest.FixtureRequest) -> Iterator[tuple[DesktopSandbox, DesktopClient]]:
    _require(request.param)
    sb = DesktopSandbox(request.param)
    client = DesktopClient(sb.socket)
    yield sb, client
    client.close()
    sb.close()


def sh(client: DesktopClient, command: str) -> dict:
    return client.setup({"type": "execute", "parameters": {"command": command, "shell": True}})


def test_no_network_but_the_socket_folder(desktop: tuple[DesktopSandbox, DesktopClient]) -> None:
    sb, client = desktop
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    code = (
        f"import socket\nfor a in [('127.0.0.1', {server.getsockname()[1]}), ('10.255.255.1', 80)]:\n"
        "    try:\n        socket.create_connection(a, timeout=1)\n        print('connected')\n"
        "    except OSError as e:\n        print(type(e).__name__)"
    )
    out = client.setup({"type": "execute", "parameters": {"command": ["python3", "-c", code]}})
    lines = out["stdout"].split()
    assert lines[0] == "ConnectionRefusedError" and lines[1] in ("OSError", "TimeoutError")
    with pytest.raises(BlockingIOError):
        server.accept()
    server.close()
    assert sh(client, "ls /run/parity")["stdout"].split() == ["control.sock"]  # what it is given
    assert sb.running()


def test_no_host_writes_outside_its_binds(
    desktop: tuple[DesktopSandbox, DesktopClient], tmp_path: Path
) -> None:
    sb, client = desktop
    targets = ["/usr/x", "/etc/x", "/x", "/opt/parity/guest/x", f"{tmp_path}/x"]
    out = sh(
        client,
        "; ".join(f"echo pwned > {t} 2>/dev/null && echo wrote || echo refused" for t in targets),
    )
    assert out["stdout"].split() == ["refused"] * len(targets)
    assert (
        not (tmp_path / "x").exists()
        and not (Path(__file__).parents[3] / "envs/src/parity/envs/desktop/guest/x").exists()
    )
    assert sh(client, "echo ok > ~/f && cat ~/f")["stdout"] == "ok\n"  # its own tmpfs home
    assert sb.running()


def _wait_for_pids(client: DesktopClient, timeout: float = 60.0) -> None:
    """Until a process can start again: the fork test's sleepers have exited and been reaped."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sh(client, "true")
            return
        except DesktopRequestError as e:
            if "Resource temporarily unavailable" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_limits_are_enforced(desktop: tuple[DesktopSandbox, DesktopClient]) -> None:
    sb, client = desktop
    forks = (
        "import os, time\nn = 0\ntry:\n    for _ in range(1000):\n        if os.fork() == 0:\n"
        "            time.sleep(5)\n            os._exit(0)\n        n += 1\n"
        "except OSError as e:\n    print(n < 256, e.errno)"
    )
    # on docker openbox may abort at the pids limit (when this test runs alone): the session
    # starts it again, so the desktop must survive the storm
    out = client.setup({"type": "execute", "parameters": {"command": ["python3", "-c", forks]}})
    assert out["stdout"] == "True 11\n"  # EAGAIN below the pids limit
    _wait_for_pids(client)  # the sleepers end (their last one forked up to 5 s ago)
    bomb = sh(client, "python3 -c \"x = b'x' * (2 << 30); print('survived')\"")
    assert bomb["returncode"] != 0 and "survived" not in bomb["stdout"]
    write = (
        "import os\ntry:\n    with open('/tmp/big', 'wb') as f:\n        for _ in range(300):\n"
        "            f.write(b'0' * (1 << 20))\nexcept OSError as e:\n    print(e.errno, os.path.getsize('/tmp/big'))"
    )
    big = client.setup({"type": "execute", "parameters": {"command": ["python3", "-c", write]}})
    errno, size = big["stdout"].split()
    assert errno in ("27", "28") and int(size) <= sb.limits.file_size_mb << 20  # EFBIG or ENOSPC
    sh(client, "rm -f /tmp/big")
    assert sb.running() and client.health()["ok"]
    _assert_window_manager_runs(client)


def _assert_window_manager_runs(client: DesktopClient) -> None:
    """One openbox runs and manages a new window (launch waits for it in the WM's client list)."""
    assert sh(client, "grep -lx openbox /proc/[0-9]*/comm | wc -l")["stdout"] == "1\n"
    client.setup({"type": "launch", "parameters": {"command": ["terminal"]}})
    assert client.windows()["active"] == "xterm"  # the WM focused it (openbox's rule)
    client.reset()


def test_a_window_manager_that_dies_is_started_again(desktop: tuple[DesktopSandbox, DesktopClient]) -> None:
    sb, client = desktop
    sh(client, "kill -ABRT $(grep -lx openbox /proc/[0-9]*/comm | cut -d/ -f3)")  # as at the pids limit
    assert client.health()["ok"]
    _assert_window_manager_runs(client)
    assert sb.running()


OWNER = """
import os, signal, sys
from parity.envs.desktop.sandbox import DesktopSandbox
sb = DesktopSandbox(sys.argv[1])
print(sb.guest.pid, flush=True)
sys.stdin.readline()  # the test has seen the sandbox's processes
os.kill(os.getpid(), signal.SIGKILL)  # the owner dies without closing anything
"""


def _tree(root: int) -> list[int]:
    """`root` and its descendants, seen from the host."""
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            stack += [int(p) for p in task.read_text().split()]
    return out


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_nothing_outlives_a_killed_owner(backend: str) -> None:
    _require(backend)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, backend], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None and owner.stdin is not None
    root = int(owner.stdout.readline())
    pids = _tree(root)
    owner.stdin.write("go\n")
    owner.stdin.flush()
    assert len(pids) > 3  # the server, Xvfb, openbox...
    assert owner.wait(timeout=60) == -9
    deadline = time.monotonic() + 30
    while [p for p in pids if Path(f"/proc/{p}").exists()] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if Path(f"/proc/{p}").exists()] == []
