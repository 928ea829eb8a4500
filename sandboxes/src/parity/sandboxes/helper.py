"""The agent that runs *inside* every sandbox (local bubblewrap and Docker alike).

It is started once per sandbox as
    python3 -I -S -c <this file's source> <repl.py's source> <limits JSON>
so it may use only the standard library of the sandbox's Python (3.11 in the image). It is
the sandbox's PID 1, which the kernel shields from signals sent from inside the namespace,
so hostile code cannot kill it.

Protocol: on stdin/stdout, frames of a 4-byte big-endian length then a UTF-8 JSON object.
Each request gets exactly one reply; binary payloads travel base64-encoded. Requests:
  {"op": "ping"}
  {"op": "run", "argv": [...], "stdin": b64|null, "timeout_s": float}
  {"op": "write", "path": str, "data": b64}        {"op": "read", "path": str, "max_bytes": int}
  {"op": "session_start", "sid": str}
  {"op": "session_run", "sid": str, "code": str, "timeout_s": float}
  {"op": "session_close", "sid": str}
  {"op": "reset"}   (end sessions and processes, empty /work and /tmp)
Replies carry {"ok": true, ...} or {"ok": false, "error": "what happened"}.
A framing copy lives on the host side (protocol.py): this file cannot import the package.
"""

import base64
import contextlib
import json
import os
import resource
import selectors
import signal
import struct
import subprocess
import sys
import time

WORKDIR = "/work"
# The unprivileged identity the helper (and so all code) takes on when started as root.
NOBODY = 65534
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKDIR,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
# Commands find this interpreter first as python3: a machine without a system python3 runs
# the helper on the host's own (uv-installed) Python, bound read-only.
if os.path.dirname(sys.executable) not in ENV["PATH"].split(":"):
    ENV["PATH"] = os.path.dirname(sys.executable) + ":" + ENV["PATH"]
# A command's output ends this long after it exits, even if a process it left holds the pipes;
# while it runs, its exit is checked this often.
EXIT_GRACE_S = 0.1
EXIT_POLL_S = 0.05
# Where the sandbox's own memory cgroup reports OOM kills (v2, then v1), when mounted.
OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def send(obj):
    data = json.dumps(obj).encode()
    sys.stdout.buffer.write(struct.pack(">I", len(data)) + data)
    sys.stdout.buffer.flush()


def recv():
    head = sys.stdin.buffer.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    return json.loads(sys.stdin.buffer.read(n))


def oom_kills():
    """Total OOM kills in the sandbox's memory cgroup, or 0 when it is not visible."""
    for path in OOM_FILES:
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            continue
    return 0


def drop_privileges(limits):
    """Become the unprivileged user for good and take on the sandbox's fixed rlimits.

    Children then inherit everything from the helper, so commands start with a plain
    vfork+exec (a Python preexec_fn forces a full fork: ~8 ms more per call). Hard == soft
    limits cannot be raised again. The helper stays PID 1, which ignores signals from inside
    the namespace that it has no handler for, and undumpable, so the same user cannot ptrace it.
    The uid change voids bubblewrap's --die-with-parent (a parent-death signal needs the
    right to signal); instead the helper exits when its stdin reaches EOF, i.e. when the
    host side closes or dies, and the host kills it directly on close().
    """
    if os.getuid() == 0:
        for d in (WORKDIR, "/tmp"):
            os.chown(d, NOBODY, NOBODY)
        os.chmod("/tmp", 0o1777)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    # Python's KeyboardInterrupt handler would let code end the helper with SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    with contextlib.suppress(ImportError, OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    caps = [
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, limits["open_files"]),
        (resource.RLIMIT_FSIZE, limits["disk_mb"] << 20),
    ]
    if limits.get("rlimit_nproc"):
        caps.append((resource.RLIMIT_NPROC, limits["max_procs"]))
    for res, value in caps:
        resource.setrlimit(res, (value, value))
    os.umask(0o022)


def limit_cpu(proc, cpu_s):
    """RLIMIT_CPU per command: SIGXCPU at the soft limit, SIGKILL one second later.

    Set from outside right after exec (the helper cannot carry it: its own CPU time adds up
    across calls); CPU used before counts all the same.
    """
    with contextlib.suppress(OSError):
        resource.prlimit(proc.pid, resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))


def spawn(argv, stdin_pipe, cpu_s, pass_fds=()):
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=WORKDIR,
        env=ENV,
        start_new_session=True,
        pass_fds=pass_fds,
    )
    limit_cpu(proc, cpu_s)
    return proc


def kill_group(proc):
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)


def proc_table():
    """{pid: (ppid, state)} of every process visible in this PID namespace."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        table[int(name)] = (int(fields[1]), fields[0])
    return table


def reap_strays(keep):
    """Kill every process that is not the helper, its ancestors or in a live session's tree.

    This catches `setsid` / double-fork daemons that left the process group of their run
    and forks racing the group kill; passes repeat until none is left (the pids limit bounds
    how many there can be), collecting the zombies re-parented to the helper.
    """
    me = os.getpid()
    for _ in range(500):
        table = proc_table()
        protected = {1, me}
        node = table.get(me, (0,))[0]
        while node:
            protected.add(node)
            node = table.get(node, (0,))[0]
        strays = 0
        for pid, (_, state) in table.items():
            node, seen = pid, set()
            while node in table and node not in seen and node not in keep:
                seen.add(node)
                node = table[node][0]
            if pid in protected or node in keep or state in "ZX":
                continue
            strays += 1
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not strays:
            return
        time.sleep(0.002)


def pump(proc, streams, stdin_data, deadline, cap, done_fd=None):
    """Feed stdin, collect stdout/stderr up to `cap` bytes in total, until exit or deadline.

    Returns (outputs, timed_out, truncated, done_bytes). With `done_fd` (sessions) the call
    ends when that pipe yields a line; otherwise when both output pipes close, or EXIT_GRACE_S
    after `proc` exits while something it started (a daemon) still holds them.
    """
    sel = selectors.DefaultSelector()
    out = {name: bytearray() for name in streams}
    for name, f in streams.items():
        os.set_blocking(f.fileno(), False)
        sel.register(f.fileno(), selectors.EVENT_READ, name)
    if done_fd is not None:
        sel.register(done_fd, selectors.EVENT_READ, "done")
    view = memoryview(stdin_data or b"")
    if proc is not None and proc.stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        if view:
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
        else:
            proc.stdin.close()
    timed_out = truncated = False
    done = bytearray()
    total = 0
    open_reads = len(streams)
    grace_end = None
    while open_reads or done_fd is not None:
        now = time.monotonic()
        left = deadline - now
        if left <= 0:
            timed_out = True
            break
        wait = left
        if proc is not None:
            if grace_end is None and proc.poll() is not None:
                grace_end = now + EXIT_GRACE_S
            if grace_end is not None and now >= grace_end:
                break
            wait = min(left, EXIT_POLL_S if grace_end is None else grace_end - now)
        for key, _ in sel.select(wait):
            name = key.data
            if name == "stdin":
                try:
                    n = os.write(key.fd, view[:65536])
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:  # the reader is gone; the rest of stdin is moot
                    n = len(view)
                view = view[n:]
                if not view:
                    sel.unregister(key.fd)
                    proc.stdin.close()
                continue
            try:
                chunk = os.read(key.fd, 65536)
            except (BlockingIOError, InterruptedError):
                continue
            if name == "done":
                done += chunk
                if b"\n" in done or not chunk:
                    sel.close()
                    return finish_pump(streams, out, cap, total, False, truncated, bytes(done))
                continue
            if not chunk:
                sel.unregister(key.fd)
                open_reads -= 1
                continue
            total, truncated = keep(out, name, chunk, cap, total)
            if truncated:
                break
        if truncated:
            break
    sel.close()
    return out, timed_out, truncated, bytes(done)


def finish_pump(streams, out, cap, total, timed_out, truncated, done):
    """After a session's completion line: drain what its pipes already hold, within the cap."""
    for name, f in streams.items():
        while True:
            try:
                chunk = os.read(f.fileno(), 65536)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                break
            total, cut = keep(out, name, chunk, cap, total)
            if cut:
                truncated = True
                break
    return out, timed_out, truncated, done


def keep(out, name, chunk, cap, total):
    """Append what fits of `chunk` under the output cap; (new total, whether it was cut)."""
    room = cap - total
    out[name] += chunk[:room]
    return total + min(len(chunk), room), len(chunk) > room


def result(exit_code, out, timed_out, truncated, oom, start, error=None):
    return {
        "ok": True,
        "exit_code": exit_code,
        "stdout": base64.b64encode(bytes(out.get("stdout", b""))).decode(),
        "stderr": base64.b64encode(bytes(out.get("stderr", b""))).decode(),
        "timed_out": timed_out,
        "oom": oom,
        "output_truncated": truncated,
        "duration_s": time.monotonic() - start,
        "error": error,
    }


def memory_error(stderr):
    return b"MemoryError" in bytes(stderr[-4096:])


def op_run(req, sessions, limits):
    start = time.monotonic()
    oom_before = oom_kills()
    stdin_data = base64.b64decode(req["stdin"]) if req.get("stdin") is not None else None
    try:
        proc = spawn(req["argv"], stdin_data is not None, limits["cpu_s"])
    except OSError as exc:
        return result(127, {"stderr": str(exc).encode()}, False, False, False, start)
    streams = {"stdout": proc.stdout, "stderr": proc.stderr}
    deadline = start + req["timeout_s"]
    out, timed_out, truncated, _ = pump(proc, streams, stdin_data, deadline, limits["output_bytes"])
    if timed_out or truncated:
        kill_group(proc)
    try:  # it may have closed its pipes and still be running
        code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_group(proc)
        code = proc.wait()
        timed_out = True
    proc.stdout.close()
    proc.stderr.close()
    reap_strays(session_pids(sessions))
    oom = oom_kills() > oom_before or (code != 0 and memory_error(out["stderr"]))
    return result(code, out, timed_out, truncated, oom, start)


class Session:
    """A Python REPL child kept alive between calls; code goes in on fd 3, 'done' lines out on fd 4."""

    def __init__(self, repl_source, limits):
        self.output_bytes = limits["output_bytes"]
        code_r, self.code_w = os.pipe()
        self.done_r, done_w = os.pipe()
        argv = ["python3", "-u", "-c", repl_source, str(code_r), str(done_w)]
        self.proc = spawn(argv, False, limits["cpu_s"], pass_fds=(code_r, done_w))
        os.close(code_r)
        os.close(done_w)

    def run(self, code, timeout_s):
        start = time.monotonic()
        oom_before = oom_kills()
        data = code.encode("utf-8", "surrogatepass")
        try:
            os.write(self.code_w, struct.pack(">I", len(data)))
            view = memoryview(data)
            while view:
                view = view[os.write(self.code_w, view[: 1 << 16]) :]
        except OSError:
            self.close()
            return result(-1, {}, False, False, False, start, "the Python session has ended")
        streams = {"stdout": self.proc.stdout, "stderr": self.proc.stderr}
        out, timed_out, truncated, done = pump(
            None, streams, None, start + timeout_s, self.output_bytes, self.done_r
        )
        error = None
        if done.strip().isdigit():
            code_ = int(done.strip())
        else:  # the interpreter died (exit(), a signal, a limit) or timed out
            self.close()
            code_ = self.proc.returncode if self.proc.returncode is not None else -9
            error = "the Python session was killed or exited; its state is lost"
        if truncated:
            self.close()
            error = "output cap reached; the Python session was killed and its state is lost"
        oom = oom_kills() > oom_before or (code_ != 0 and memory_error(out["stderr"]))
        return result(code_, out, timed_out, truncated, oom, start, error)

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        kill_group(self.proc)
        self.proc.wait()
        for fd in (self.code_w, self.done_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.proc.stdout.close()
        self.proc.stderr.close()


def session_pids(sessions):
    return {s.proc.pid for s in sessions.values() if s.alive()}


def inside_workdir(path):
    full = os.path.realpath(os.path.join(WORKDIR, path))
    if full != WORKDIR and not full.startswith(WORKDIR + "/"):
        raise ValueError(f"path {path!r} is outside the work dir {WORKDIR}")
    return full


def op_write(req):
    full = inside_workdir(req["path"])
    os.makedirs(os.path.dirname(full), exist_ok=True)
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(req["data"]))
    return {"ok": True}


def op_read(req):
    full = inside_workdir(req["path"])
    with open(os.open(full, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        data = f.read(req["max_bytes"] + 1)
    return {
        "ok": True,
        "data": base64.b64encode(data[: req["max_bytes"]]).decode(),
        "truncated": len(data) > req["max_bytes"],
    }


def remove_tree(path):
    if os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(path):
            remove_tree(os.path.join(path, name))
        os.rmdir(path)
    else:
        os.unlink(path)


def handle(req, sessions, repl_source, limits):
    op = req.get("op")
    if op == "ping":
        return {"ok": True, "pid": os.getpid(), "uid": os.getuid()}
    if op == "run":
        return op_run(req, sessions, limits)
    if op == "write":
        return op_write(req)
    if op == "read":
        return op_read(req)
    if op == "reset":
        for sess in sessions.values():
            sess.close()
        sessions.clear()
        reap_strays(set())
        for top in (WORKDIR, "/tmp"):
            for name in os.listdir(top):
                remove_tree(os.path.join(top, name))
        return {"ok": True}
    if op == "session_start":
        sessions[req["sid"]] = Session(repl_source, limits)
        return {"ok": True}
    if op in ("session_run", "session_close"):
        sess = sessions.get(req["sid"])
        if sess is None:
            return {
                "ok": False,
                "error": "no Python session {!r} (closed or never started)".format(req["sid"]),
            }
        if op == "session_close":
            sessions.pop(req["sid"]).close()
            return {"ok": True}
        reply = sess.run(req["code"], req["timeout_s"])
        if not sess.alive():
            sessions.pop(req["sid"])
        reap_strays(session_pids(sessions))
        return reply
    return {"ok": False, "error": f"unknown op {op!r}"}


def main():
    # The session interpreter's source (repl.py) and the sandbox's limits (Limits as JSON
    # plus the rlimit_nproc fallback), passed by the host as arguments.
    repl_source, limits = sys.argv[1], json.loads(sys.argv[2])
    drop_privileges(limits)
    sessions = {}
    while True:
        req = recv()
        if req is None:
            break
        try:
            reply = handle(req, sessions, repl_source, limits)
        except Exception as exc:  # a bad request must not end the sandbox
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        send(reply)
    for sess in sessions.values():
        sess.close()


if __name__ == "__main__":  # `python3 -c` runs it as __main__; an import only defines it
    main()
