"""Start the desktop's control server inside a sandbox and hand back its unix socket.

Two backends, same result (a socket path on the host; the sandbox has no network at all):
* "local": bubblewrap (all namespaces unshared, uid 1000, read-only /usr, tmpfs home and
  /tmp), rlimits, and cgroup-v1 memory and pids limits where the host lets us create them.
* "docker": the image from scripts/build_desktop_image.sh, with network_mode="none",
  read-only root, tmpfs home and /tmp, no capabilities, no-new-privileges, uid 1000, memory,
  CPU and pids limits.
In both, the socket lives in a host folder bind-mounted at /run/parity, and the guest code
(this package's `guest/`) is bind-mounted read-only, so the image holds only Debian packages.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

GUEST_DIR = Path(__file__).parent / "guest"
IMAGE = "parity-desktop:latest"
LABEL = "parity.desktop"
_SOCKET = "control.sock"
_ETC = ("fonts", "X11", "xdg", "alternatives", "ld.so.cache", "localtime")
_CACHES = ("/var/cache/fontconfig",)  # without it every app start rescans the fonts


class DesktopStartError(RuntimeError):
    """The sandbox or the desktop in it did not come up; the message has the server's log tail."""


@dataclass(frozen=True)
class DesktopLimits:
    """Resource limits of one desktop sandbox."""

    memory_mb: int = 1024
    pids: int = 256
    cpus: float = 1.0
    file_size_mb: int = 256
    width: int = 1024
    height: int = 768


def pick_backend(backend: str) -> str:
    """"docker" or "local" as asked; "auto" is docker where an engine answers and the image exists."""
    if backend != "auto":
        return backend
    try:
        import docker  # heavy; only probed when the backend is not given

        client = docker.from_env(timeout=5)
        client.images.get(IMAGE)
    except Exception:  # no SDK, no engine, no image: the local backend needs none of them
        return "local"
    return "docker"


class DesktopSandbox:
    """A running sandbox with a control server; `socket` is the host path of its unix socket."""

    def __init__(self, backend: str, limits: DesktopLimits = DesktopLimits(), start_timeout: float = 60.0) -> None:
        if backend not in ("local", "docker", "auto"):
            raise ValueError(f"backend must be 'local', 'docker' or 'auto', got {backend!r}")
        backend = pick_backend(backend)
        self.backend, self.limits = backend, limits
        self.host_dir = Path(tempfile.mkdtemp(prefix="parity-desktop-"))
        self.sock_dir = self.host_dir / "run"
        self.sock_dir.mkdir()
        self.sock_dir.chmod(0o777)  # uid 1000 in the sandbox creates the socket here
        self.socket = str(self.sock_dir / _SOCKET)
        self._proc: subprocess.Popen | None = None
        self._container = None
        self._cgroups: list[Path] = []
        self.closed = False
        try:
            self._start_local() if backend == "local" else self._start_docker()
            self._wait(start_timeout)
        except BaseException:
            self.close()
            raise

    def _guest_argv(self) -> list[str]:
        return ["python3", "-m", "guest.server", "--socket", f"/run/parity/{_SOCKET}", "--run-dir", "/tmp/run",
                "--home", "/home/user", "--width", str(self.limits.width), "--height", str(self.limits.height)]

    def _start_local(self) -> None:
        if shutil.which("bwrap") is None:
            raise DesktopStartError("the local backend needs bubblewrap (Debian package bubblewrap)")
        (self.host_dir / "passwd").write_text("user:x:1000:1000:user:/home/user:/bin/sh\n")
        (self.host_dir / "group").write_text("user:x:1000:\n")
        argv = ["bwrap", "--unshare-all", "--unshare-user", "--uid", "1000", "--gid", "1000",
                "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr",
                "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/sbin", "/sbin"]
        if Path("/usr/lib64").exists():
            argv += ["--symlink", "usr/lib64", "/lib64"]
        for name in _ETC:
            if Path("/etc", name).exists():
                argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        for path in _CACHES:
            if Path(path).exists():
                argv += ["--ro-bind", path, path]
        argv += ["--ro-bind", str(self.host_dir / "passwd"), "/etc/passwd",
                 "--ro-bind", str(self.host_dir / "group"), "/etc/group",
                 "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/home/user",
                 "--tmpfs", "/home/user", "--bind", str(self.sock_dir), "/run/parity",
                 "--ro-bind", str(GUEST_DIR), "/opt/parity/guest", "--chdir", "/home/user",
                 "--setenv", "PYTHONPATH", "/opt/parity", "--setenv", "HOME", "/home/user",
                 "--setenv", "PATH", "/usr/bin:/bin", *self._guest_argv()]
        self._cgroups = _make_cgroups(self.limits)
        log = open(self.host_dir / "server.log", "wb")  # noqa: SIM115 - closed right after Popen dups it
        with log:
            self._proc = subprocess.Popen(argv, env={}, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          start_new_session=True, preexec_fn=self._limit_self)

    def _limit_self(self) -> None:
        """Runs in the child before exec: join the cgroups, set rlimits."""
        for group in self._cgroups:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        mb = 1 << 20
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limits.file_size_mb * mb,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    def _start_docker(self) -> None:
        import docker  # heavy; only the docker backend needs it

        client = docker.from_env()
        mb = self.limits.memory_mb
        self._container = client.containers.run(
            IMAGE, self._guest_argv(), detach=True, user="1000:1000", network_mode="none", read_only=True,
            tmpfs={"/tmp": "size=512m,mode=1777", "/home/user": "size=256m,uid=1000,gid=1000,mode=755"},
            volumes={str(self.sock_dir): {"bind": "/run/parity", "mode": "rw"},
                     str(GUEST_DIR): {"bind": "/opt/parity/guest", "mode": "ro"}},
            environment={"PYTHONPATH": "/opt/parity", "HOME": "/home/user"}, working_dir="/home/user",
            mem_limit=f"{mb}m", memswap_limit=f"{mb}m", nano_cpus=int(self.limits.cpus * 1e9),
            pids_limit=self.limits.pids, cap_drop=["ALL"], security_opt=["no-new-privileges"],
            labels={LABEL: "1"}, name=f"parity-desktop-{uuid.uuid4().hex[:12]}")

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.socket):
            if not self.running():
                raise DesktopStartError(f"desktop sandbox exited during start: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise DesktopStartError(f"desktop did not start within {timeout:g} s: {self.log_tail()}")
            time.sleep(0.05)

    def running(self) -> bool:
        """Whether the sandbox's server process (or container) is still alive."""
        if self._proc is not None:
            return self._proc.poll() is None
        if self._container is not None:
            with contextlib.suppress(Exception):
                self._container.reload()
                return self._container.status in ("created", "running")
        return False

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's stdout/stderr (for error messages)."""
        if self._container is not None:
            with contextlib.suppress(Exception):
                return self._container.logs().decode("utf-8", "replace")[-chars:]
        path = self.host_dir / "server.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def close(self) -> None:
        """Stop everything in the sandbox and remove its host folder; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        if self._container is not None:
            with contextlib.suppress(Exception):
                self._container.remove(force=True)
        for group in self._cgroups:
            _remove_cgroup(group)
        shutil.rmtree(self.host_dir, ignore_errors=True)


def _make_cgroups(limits: DesktopLimits) -> list[Path]:
    """Memory and pids cgroups (v1) for one sandbox, or none if the host does not allow it."""
    made: list[Path] = []
    name = f"parity-desktop-{uuid.uuid4().hex[:12]}"
    for controller, settings in (("memory", {"memory.limit_in_bytes": limits.memory_mb << 20}),
                                 ("pids", {"pids.max": limits.pids})):
        group = Path("/sys/fs/cgroup", controller, name)
        try:
            group.mkdir()
            for key, value in settings.items():
                (group / key).write_text(str(value))
            made.append(group)
        except OSError:
            _remove_cgroup(group)
    return made


def _remove_cgroup(group: Path) -> None:
    """Remove a cgroup once its processes are gone (they are killed just before)."""
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
