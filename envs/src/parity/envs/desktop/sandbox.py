"""Start the desktop's control server in a `parity.sandboxes` guest; hand back its unix socket.

The isolation is parity.sandboxes' (`launch_guest`), the same for the code sandbox: no network
at all, read-only system files, tmpfs home and /tmp, no capabilities, memory, pids, CPU,
file-size and open-files limits, and clean-up after a crashed owner, on the "local"
(bubblewrap) or "docker" backend. This module only says what the desktop needs: uid 1000,
its socket folder at /run/parity, the guest code (this package's `guest/`) read-only at
/opt/parity/guest, and, locally, the host's fonts and X configuration; on docker the image
from scripts/build_desktop_image.sh, which holds only Debian packages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from parity.sandboxes import Bind, GuestSpec, Limits, SandboxError, launch_guest

GUEST_DIR = Path(__file__).parent / "guest"
IMAGE = "parity-desktop:latest"
HOME = "/home/user"
_SOCKET = "control.sock"
# /var/cache/fontconfig: without it every app start rescans the fonts; /etc/gimp: the files
# GIMP copies into a new user's folder at its first start (without them it refuses to start)
_HOST_SYSTEM = ("/etc/fonts", "/etc/X11", "/etc/xdg", "/etc/localtime", "/var/cache/fontconfig",
                "/etc/libreoffice", "/etc/gimp")


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
    """ "docker" or "local" as asked; "auto" is docker where an engine answers and the image exists."""
    if backend != "auto":
        return backend
    try:
        import docker  # heavy; only probed when the backend is not given

        client = docker.from_env(timeout=5)
        client.images.get(IMAGE)
    except Exception:  # no SDK, no engine, no image: the local backend needs none of them
        return "local"
    return "docker"


def desktop_spec(limits: DesktopLimits) -> GuestSpec:
    """The desktop's guest: its control server and what it may see and use."""
    return GuestSpec(
        argv=(
            "python3",
            "-m",
            "guest.server",
            "--socket",
            f"/run/parity/{_SOCKET}",
            "--run-dir",
            "/tmp/run",
            "--home",
            HOME,
            "--width",
            str(limits.width),
            "--height",
            str(limits.height),
        ),
        limits=Limits(
            memory_mb=limits.memory_mb,
            max_procs=limits.pids,
            cpus=limits.cpus,
            disk_mb=limits.file_size_mb,
            open_files=1024,
        ),
        user=(1000, 1000),
        home=HOME,
        env={"PYTHONPATH": "/opt/parity", "HOME": HOME, "PATH": "/usr/bin:/bin"},
        binds=(Bind(str(GUEST_DIR), "/opt/parity/guest"),),
        socket_dir="/run/parity",
        etc_files={"passwd": f"user:x:1000:1000:user:{HOME}:/bin/sh\n", "group": "user:x:1000:\n"},
        host_system=_HOST_SYSTEM,
        image=IMAGE,
    )


class DesktopSandbox:
    """A running sandbox with a control server; `socket` is the host path of its unix socket
    and `guest` the parity.sandboxes handle of the sandbox."""

    def __init__(
        self, backend: str, limits: DesktopLimits = DesktopLimits(), start_timeout: float = 60.0
    ) -> None:
        if backend not in ("local", "docker", "auto"):
            raise ValueError(f"backend must be 'local', 'docker' or 'auto', got {backend!r}")
        self.backend, self.limits = pick_backend(backend), limits
        try:
            self.guest = launch_guest(self.backend, desktop_spec(limits))
        except SandboxError as e:
            raise DesktopStartError(str(e)) from e
        assert self.guest.socket_dir is not None
        self.socket = str(self.guest.socket_dir / _SOCKET)
        try:
            self._wait(start_timeout)
        except BaseException:
            self.close()
            raise

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not Path(self.socket).exists():
            if not self.running():
                raise DesktopStartError(f"desktop sandbox exited during start: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise DesktopStartError(
                    f"desktop did not start within {timeout:g} s: {self.log_tail()}"
                )
            time.sleep(0.05)

    @property
    def closed(self) -> bool:
        return self.guest.closed

    def running(self) -> bool:
        """Whether the sandbox's server is still alive."""
        return self.guest.running()

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's stdout/stderr (for error messages)."""
        return self.guest.log_tail(chars)

    def close(self) -> None:
        """Stop everything in the sandbox and remove its host folder; safe to call twice."""
        self.guest.close()
