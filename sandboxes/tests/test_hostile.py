"""The hostile suite, on both backends: each program is contained, the call returns with the
right flag, the host is unchanged, and no process of the sandbox outlives `close()`. The
guest tests at the end check the same for any program launched from a GuestSpec (the
desktop's own spec runs them in envs/tests/desktop/test_desktop_hostile.py).

Timing: calls run with timeout_s=3; "returns in time" is checked against timeout + 20 s, a
hang detector rather than a speed threshold.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from parity.sandboxes import Bind, Guest, GuestSpec, Limits, Sandbox, launch_guest, open_sandbox

pytestmark = pytest.mark.timeout(180)
HANG_MARGIN_S = 20.0


def timed(sb: Sandbox, code: str, token: str, timeout_s: float | None = None):
    """run_python(code) tagged with `token` in its command line; (result, wall seconds)."""
    t0 = time.monotonic()
    r = sb.run_python(f"{code}\n# {token}", timeout_s=timeout_s)
    return r, time.monotonic() - t0


def test_fork_bomb(sb: Sandbox, token: str, survivors: Callable[[], list[int]]) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r, wall = timed(sb, code, token)
    assert r.timed_out and r.exit_code == -9
    assert wall < sb.limits.timeout_s + HANG_MARGIN_S
    assert survivors() == []  # the bomb's forks left the group too: all were killed
    assert sb.run(["echo", "alive"]).stdout == "alive\n"
    sb.close()
    assert survivors() == []


def test_process_limit_stops_forks(sb: Sandbox, token: str) -> None:
    code = (
        "import os, time\nn = 0\ntry:\n    for _ in range(500):\n"
        "        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n"
        "        n += 1\nexcept OSError as e:\n    print('stopped', n < 500, e.errno)"
    )
    r, _ = timed(sb, code, token)
    assert r.stdout == "stopped True 11\n"  # EAGAIN well before 500 processes


def test_memory_bomb(sb: Sandbox, token: str) -> None:
    r, wall = timed(sb, "x = b'x' * (1 << 30)\nprint('survived')", token)
    assert r.oom and not r.timed_out
    assert r.exit_code != 0 and "survived" not in r.stdout
    assert wall < sb.limits.timeout_s + HANG_MARGIN_S
    assert sb.run(["echo", "alive"]).stdout == "alive\n"


def test_infinite_output(sb: Sandbox, token: str) -> None:
    r, wall = timed(sb, "while True:\n    print('y' * 1000)", token)
    assert r.output_truncated and not r.timed_out
    assert len(r.stdout.encode()) + len(r.stderr.encode()) == sb.limits.output_bytes
    assert r.stdout.startswith("y" * 1000 + "\n")
    assert wall < sb.limits.timeout_s + HANG_MARGIN_S


def test_sleep_forever(sb: Sandbox, survivors: Callable[[], list[int]], token: str) -> None:
    r, wall = timed(sb, "import time\ntime.sleep(10**6)", token, timeout_s=1)
    assert r.timed_out and r.exit_code == -9
    assert wall < 1 + HANG_MARGIN_S
    assert survivors() == []


def test_cpu_time_limit(backend: str, token: str) -> None:
    with open_sandbox(backend, Limits(timeout_s=60, cpu_s=1)) as sb:
        r, _ = timed(sb, "while True:\n    pass", token)
    assert not r.timed_out
    assert r.exit_code in (-24, -9)  # SIGXCPU at the soft limit, SIGKILL at the hard one


def test_huge_file_write(sb: Sandbox, token: str) -> None:
    code = (
        "with open('big', 'wb') as f:\n    for _ in range(200):\n        f.write(b'0' * (1 << 20))"
    )
    r, _ = timed(sb, code, token)
    assert r.exit_code == 1 and "File too large" in r.stderr
    size = int(sb.run(["stat", "-c", "%s", "big"]).stdout)
    assert size <= sb.limits.disk_mb << 20


def test_filling_tmp(sb: Sandbox, token: str) -> None:
    code = (
        "i = 0\nwhile True:\n    with open(f'/tmp/f{i}', 'wb') as f:\n"
        "        f.write(b'0' * (1 << 20))\n    i += 1"
    )
    r, _ = timed(sb, code, token)
    assert r.exit_code == 1 and "No space left on device" in r.stderr
    used_kb = int(sb.run(["du", "-sk", "/tmp"]).stdout.split()[0])
    assert used_kb <= (sb.limits.disk_mb << 10) + 64


def test_host_files_are_invisible(sb: Sandbox, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret-4821")
    checkout = Path(__file__).resolve().parents[2] / "pyproject.toml"
    for path in ("/etc/shadow", str(secret), str(checkout), str(Path.home() / ".bashrc")):
        r = sb.run(["cat", path])
        assert r.exit_code == 1, path
        assert "No such file" in r.stderr or "Permission denied" in r.stderr, r.stderr
        assert "host-secret" not in r.stdout and "root:" not in r.stdout
    listing = sb.run(["sh", "-c", f"ls {Path.home()} {tmp_path} {checkout.parent}"])
    assert listing.exit_code != 0 and listing.stdout == ""


def test_no_network(sb: Sandbox) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        f"for addr in [('127.0.0.1', {port}), ('10.255.255.1', 80)]:\n"
        "    try:\n        socket.create_connection(addr, timeout=1)\n        print('connected')\n"
        "    except OSError as e:\n        print('blocked', type(e).__name__)\n"
        "try:\n    socket.getaddrinfo('example.com', 80)\n    print('resolved')\n"
        "except OSError as e:\n    print('blocked', type(e).__name__)"
    )
    r = sb.run_python(code)
    lines = r.stdout.splitlines()
    assert lines[0] == "blocked ConnectionRefusedError"  # its own loopback, not the host's
    assert lines[1] in ("blocked OSError", "blocked TimeoutError")  # no route at all
    assert lines[2] == "blocked gaierror"
    with pytest.raises(BlockingIOError):
        server.accept()  # nothing reached the host's listener
    server.close()


def test_killing_its_parent(sb: Sandbox, token: str) -> None:
    code = (
        "import os, signal\nfor pid in (os.getppid(), 1):\n    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        print(type(e).__name__)\n"
        "print('done')"
    )
    r, _ = timed(sb, code, token)
    assert r.stdout.endswith("done\n")
    assert sb.ping()
    assert sb.run(["echo", "alive"]).stdout == "alive\n"


def test_setsid_daemon_does_not_outlive_the_call_or_close(
    sb: Sandbox, token: str, survivors: Callable[[], list[int]]
) -> None:
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(1000)\n    os._exit(0)\nprint('spawned')"
    )
    r, _ = timed(sb, code, token)
    assert r.stdout == "spawned\n"
    assert survivors() == []
    sb.close()
    assert survivors() == []


def test_close_kills_session_children(backend: str, token: str, survivors) -> None:
    sb = open_sandbox(backend, Limits(timeout_s=5))
    sess = sb.python_session()
    r = sess.run(
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1000)  # {token}'])"
    )
    assert r.exit_code == 0
    # A session's children live between its calls. Popen returns a moment before the
    # kernel shows the new command line, so wait for it to appear.
    for _ in range(200):
        if survivors():
            break
        time.sleep(0.01)
    assert len(survivors()) == 1
    sb.close()
    assert survivors() == []


def test_rlimits_cannot_be_raised(sb: Sandbox) -> None:
    code = (
        "import resource\nfor name in ('RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE'):\n"
        "    res = getattr(resource, name)\n    soft, hard = resource.getrlimit(res)\n"
        "    try:\n        resource.setrlimit(res, (hard * 2, hard * 2))\n        print(name, 'raised')\n"
        "    except (ValueError, OSError) as e:\n        print(name, e)"
    )
    r = sb.run_python(code)
    assert r.stdout.splitlines() == [
        f"{n} not allowed to raise maximum limit"
        for n in ("RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE")
    ]


OWNER = """
import os, signal, sys
from parity.sandboxes import Limits, open_sandbox
sb = open_sandbox(sys.argv[1], Limits(timeout_s=5))
sess = sb.python_session()
sess.run("import subprocess, sys\\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1000)  # ' + %r])")
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the owner dies without closing anything
"""


def test_sandbox_dies_with_its_owner(backend: str, token: str, survivors) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", OWNER % token, backend], capture_output=True, text=True, timeout=120
    )
    assert proc.stdout == "ready\n" and proc.returncode == -9, proc.stderr
    for _ in range(300):  # the engine needs a moment to notice a closed attach socket
        if not survivors():
            break
        time.sleep(0.1)
    assert survivors() == []


def test_signals_to_the_helper_are_ignored(sb: Sandbox) -> None:
    code = "import os, signal\nfor sig in (2, 15, 1, 10, 9):\n    os.kill(1, sig)\nprint('sent')"
    assert sb.run_python(code).stdout == "sent\n"
    assert sb.ping() and sb.run(["echo", "alive"]).stdout == "alive\n"


# -- any guest program (GuestSpec), on both backends: the same containment as the helper --

GUEST_LIMITS = Limits(memory_mb=128, max_procs=32, disk_mb=16)


def run_guest(backend: str, code: str, token: str, **spec: object) -> tuple[Guest, str]:
    """Launch `python3 -c code` as a guest with a socket folder at /run/out, wait for it to
    end, and return it (still open) with what it wrote to /run/out/result."""
    argv = ("python3", "-c", f"{code}\n# {token}")
    guest = launch_guest(backend, GuestSpec(argv, GUEST_LIMITS, socket_dir="/run/out", **spec))  # type: ignore[arg-type]
    deadline = time.monotonic() + 60
    while guest.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert guest.socket_dir is not None
    result = guest.socket_dir / "result"
    return guest, result.read_text() if result.exists() else ""


def test_guest_has_no_network_but_its_socket_folder(backend: str, token: str) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    code = (
        "import socket\nout = []\n"
        f"for addr in [('127.0.0.1', {server.getsockname()[1]}), ('10.255.255.1', 80)]:\n"
        "    try:\n        socket.create_connection(addr, timeout=1)\n        out.append('connected')\n"
        "    except OSError as e:\n        out.append(type(e).__name__)\n"
        "try:\n    socket.getaddrinfo('example.com', 80)\nexcept OSError as e:\n"
        "    out.append(type(e).__name__)\n"
        "open('/run/out/result', 'w').write(' '.join(out))"
    )
    guest, result = run_guest(backend, code, token)
    guest.close()
    refused, unreachable, dns = result.split()
    assert refused == "ConnectionRefusedError"  # its own loopback, not the host's
    assert unreachable in ("OSError", "TimeoutError") and dns == "gaierror"
    with pytest.raises(BlockingIOError):
        server.accept()
    server.close()


def test_guest_writes_only_into_its_writable_binds(
    backend: str, token: str, tmp_path: Path
) -> None:
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    rw.chmod(0o777)  # the guest's uid writes here
    (tmp_path / "secret.txt").write_text("host-secret-4821")
    targets = [
        "/usr/x",
        "/etc/x",
        "/x",
        "/ro/x",
        "/rw/x",
        f"{tmp_path}/x",
        f"{tmp_path}/secret.txt",
    ]
    code = (
        "out = []\n"
        f"for path in {targets!r}:\n"
        "    try:\n        open(path, 'a').write('pwned')\n        out.append('wrote')\n"
        "    except OSError as e:\n        out.append(type(e).__name__)\n"
        "open('/run/out/result', 'w').write(' '.join(out))"
    )
    binds = (Bind(str(ro), "/ro"), Bind(str(rw), "/rw", writable=True))
    guest, result = run_guest(backend, code, token, binds=binds)
    guest.close()
    outcome = dict(zip(targets, result.split(), strict=True))
    assert outcome.pop("/rw/x") == "wrote" and (rw / "x").read_text() == "pwned"
    assert "wrote" not in outcome.values(), outcome
    assert list(ro.iterdir()) == [] and not (tmp_path / "x").exists()
    assert (tmp_path / "secret.txt").read_text() == "host-secret-4821"


def test_guest_limits_are_enforced(backend: str, token: str) -> None:
    code = (
        "import os, time\nout = []\nn = 0\ntry:\n    for _ in range(500):\n"
        "        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n"
        "        n += 1\nexcept OSError as e:\n    out.append(f'forks {n < 32} {e.errno}')\n"
        "try:\n    open('/tmp/big', 'wb').write(b'0' * (32 << 20))\nexcept OSError as e:\n"
        "    out.append(f'file {e.errno}')\n"
        "open('/run/out/result', 'w').write('\\n'.join(out))\n"
        "x = b'x' * (1 << 30)\nopen('/run/out/result', 'a').write('survived')"
    )
    guest, result = run_guest(backend, code, token)
    guest.close()
    # EAGAIN below max_procs; EFBIG (RLIMIT_FSIZE) or ENOSPC (tmpfs size); the bomb dies.
    forks, file, *rest = result.splitlines()
    assert forks == "forks True 11" and file in ("file 27", "file 28") and rest == [], result


GUEST_OWNER = """
import os, signal, sys
from parity.sandboxes import GuestSpec, launch_guest
guest = launch_guest(sys.argv[1], GuestSpec(("python3", "-c", "import time; time.sleep(1000)  # " + %r)))
print(guest.host_dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the owner dies without closing anything
"""


def test_guest_leaves_nothing_running_after_its_owner_is_killed(
    backend: str, token: str, survivors: Callable[[], list[int]]
) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", GUEST_OWNER % token, backend],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == -9 and proc.stdout, proc.stderr
    for _ in range(300):  # the engine needs a moment to notice a closed attach socket
        if not survivors():
            break
        time.sleep(0.1)
    assert survivors() == []
    from pathlib import Path

    from parity.sandboxes.guest import remove_orphan_dirs

    host_dir = Path(proc.stdout.strip())
    assert host_dir.is_dir()  # nobody closed it; the next guest's start removes it
    remove_orphan_dirs()
    assert not host_dir.exists()
    if backend == "docker":  # the exited container goes with the next guest's start
        from parity.sandboxes.docker_backend import LABEL, docker_client, remove_stale_containers

        client = docker_client()
        remove_stale_containers(client)
        left = client.containers.list(all=True, filters={"label": LABEL})
        assert not [c for c in left if token in " ".join(c.attrs["Config"]["Cmd"])]
