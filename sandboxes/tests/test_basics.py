"""Running commands, snippets and files, on both backends: exact outputs and flags."""

from __future__ import annotations

import asyncio
import os

import pytest

from parity.sandboxes import ExecResult, Limits, Sandbox, SandboxError, open_sandbox

pytestmark = pytest.mark.timeout(120)

JSON_KEYS = {"exit_code", "stdout", "stderr", "timed_out", "oom", "output_truncated", "duration_s"}


def test_print_one(sb: Sandbox) -> None:
    r = sb.run(["python3", "-c", "print(1)"])
    assert (r.exit_code, r.stdout, r.stderr) == (0, "1\n", "")
    assert not (r.timed_out or r.oom or r.output_truncated or r.breached)
    assert r.ok and r.duration_s > 0
    assert set(r.to_json()) == JSON_KEYS


def test_exit_code_stderr_and_stdin(sb: Sandbox) -> None:
    r = sb.run(["sh", "-c", "cat; echo oops >&2; exit 7"], stdin="piped\n")
    assert (r.exit_code, r.stdout, r.stderr) == (7, "piped\n", "oops\n")


def test_run_python_and_stdin_bytes(sb: Sandbox) -> None:
    r = sb.run_python("import sys; print(sys.stdin.read()[::-1])", stdin=b"abc")
    assert r.stdout == "cba\n"


def test_runs_as_unprivileged_user_in_work_dir(sb: Sandbox) -> None:
    r = sb.run(["sh", "-c", "id -u; pwd; echo $HOME"])
    assert r.stdout == "65534\n/work\n/work\n"


def test_missing_command_is_a_result(sb: Sandbox) -> None:
    r = sb.run(["definitely-not-a-command"])
    assert r.exit_code == 127
    assert "definitely-not-a-command" in r.stderr


def test_non_utf8_output_is_replaced(sb: Sandbox) -> None:
    r = sb.run_python("import sys; sys.stdout.buffer.write(b'ok\\xff\\xfe!')")
    assert r.stdout == "ok\ufffd\ufffd!"


def test_files_round_trip_and_read_cap(sb: Sandbox) -> None:
    sb.write_file("dir/a.bin", b"\x00\x01hello")
    assert sb.read_file("dir/a.bin") == b"\x00\x01hello"
    assert sb.read_file("dir/a.bin", max_bytes=3) == b"\x00\x01h"
    assert sb.run(["cat", "dir/a.bin"]).stdout == "\x00\x01hello"
    sb.run(["sh", "-c", "echo made > out.txt"])
    assert sb.read_file("out.txt") == b"made\n"


def test_file_paths_outside_work_dir_are_refused(sb: Sandbox) -> None:
    with pytest.raises(SandboxError, match="outside the work dir"):
        sb.read_file("../etc/passwd")
    with pytest.raises(SandboxError, match="outside the work dir"):
        sb.write_file("/tmp/x", b"x")
    sb.run(["ln", "-s", "/etc/hostname", "link"])
    with pytest.raises(SandboxError, match="outside the work dir"):
        sb.read_file("link")


def test_missing_file_names_it(sb: Sandbox) -> None:
    with pytest.raises(SandboxError, match=r"nope\.txt"):
        sb.read_file("nope.txt")


def test_close_is_idempotent_and_final(backend: str) -> None:
    sandbox = open_sandbox(backend, Limits(timeout_s=5))
    with sandbox:
        assert sandbox.alive and sandbox.ping()
    sandbox.close()
    assert not sandbox.alive
    with pytest.raises(SandboxError, match="closed"):
        sandbox.run(["true"])


def test_asyncio_variants(sb: Sandbox) -> None:
    async def go() -> list[ExecResult]:
        await sb.awrite_file("x.txt", "data")
        sess = sb.python_session()
        a = await sb.arun(["cat", "x.txt"])
        b = await sb.arun_python("print(2 + 2)")
        await sess.arun("y = 5")
        c = await sess.arun("print(y * 2)")
        assert await sb.aread_file("x.txt") == b"data"
        return [a, b, c]

    a, b, c = asyncio.run(go())
    assert (a.stdout, b.stdout, c.stdout) == ("data", "4\n", "10\n")


def test_helper_death_gives_clear_error_not_hang(backend: str) -> None:
    sandbox = open_sandbox(backend, Limits(timeout_s=5))
    if backend == "local":
        import signal

        signal.pidfd_send_signal(sandbox._helper_fd, signal.SIGKILL)  # type: ignore[attr-defined]
    else:
        sandbox.client.api.kill(sandbox.container_id)  # type: ignore[attr-defined]
    with pytest.raises(SandboxError, match="helper process failed"):
        sandbox.run(["true"])
    assert not sandbox.alive and not sandbox.ping()
    with pytest.raises(SandboxError, match="unusable"):
        sandbox.run(["true"])
    sandbox.close()


def _owned_container(client, owner_pid: int):
    """A created (not started) sandbox-labelled container whose owner is `owner_pid` on this host."""
    import socket

    from parity.sandboxes.docker_backend import DEFAULT_IMAGE, LABEL

    labels = {LABEL: "1", f"{LABEL}.owner": f"{socket.gethostname()}:{owner_pid}"}
    return client.containers.create(DEFAULT_IMAGE, ["sleep", "1000"], labels=labels, network_mode="none")


@pytest.mark.docker
@pytest.mark.usefixtures("docker_ready")
def test_remove_stale_containers() -> None:
    import subprocess

    from parity.sandboxes.docker_backend import docker_client, remove_stale_containers

    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs
    client = docker_client()
    stale = _owned_container(client, dead.pid)
    assert remove_stale_containers(client) >= 1
    assert not client.containers.list(all=True, filters={"id": stale.id})


@pytest.mark.docker
@pytest.mark.usefixtures("docker_ready")
def test_remove_stale_containers_survives_a_container_removed_while_listing() -> None:
    import os

    from parity.sandboxes.docker_backend import docker_client, remove_stale_containers

    client = docker_client()
    other = _owned_container(client, os.getpid())  # a live owner
    listing = client.api.containers

    def listed_then_closed(*args, **kwargs):  # another owner closes its sandbox right after the listing
        rows = listing(*args, **kwargs)
        assert other.id in {r["Id"] for r in rows}
        other.remove(force=True)
        return rows

    client.api.containers = listed_then_closed
    try:
        assert remove_stale_containers(client) == 0
    finally:
        client.api.containers = listing


def test_background_process_holding_the_pipes_does_not_stall_the_call(sb: Sandbox) -> None:
    r = sb.run(["sh", "-c", "sleep 100 & echo started"], timeout_s=30)
    assert (r.exit_code, r.stdout, r.timed_out) == (0, "started\n", False)


def test_a_local_sandbox_works_with_descriptors_above_1024_in_use() -> None:
    """A rollout worker with hundreds of sandboxes and agents' sockets open hands a new
    sandbox descriptors above select()'s limit (1024): its pipes must still be read."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        with open_sandbox("local") as sb:
            assert sb.run_python("print(6 * 7)").stdout == "42\n"
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
