"""Any program in a sandbox: what it runs and sees (GuestSpec), and the handle of a running one.

The code sandbox (the helper, see sandbox.py) is one such program; long-running servers such
as the desktop are others. Both backends launch every program with the same hardening, limits
and clean-up: local.py (bubblewrap + cgroups) and docker_backend.py (a locked-down container).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from parity.sandboxes.limits import Limits

# The PATH a guest gets unless its spec sets one.
PATH = "/usr/local/bin:/usr/bin:/bin"
# PID 1 of a guest's sandbox: runs the program and ends it when stdin reaches EOF, i.e. when
# the owner closes its end or dies (the program itself may not read stdin); the end of PID 1
# makes the kernel kill the rest. bubblewrap's --die-with-parent does not survive the uid
# switch into the guest's user.
WATCH_STDIN = (
    'exec 3<&0; "$@" 3<&- </dev/null & g=$!; { cat <&3 >/dev/null; kill -9 $g; } & wait $g'
)


@dataclass(frozen=True)
class Bind:
    """A host path shown inside the sandbox at `guest`; read-only unless `writable`."""

    host: str
    guest: str
    writable: bool = False


@dataclass(frozen=True)
class GuestSpec:
    """A program to run in a sandbox and all it may see of the host; the rest stays hidden.

    Always: no network, read-only system files, private size-capped tmpfs `home` (its working
    dir) and /tmp, no capabilities, the limits' memory, pids, CPU share, file size and open
    files, no core dumps. `limits.timeout_s`, `cpu_s`, `output_bytes` and `stdin_bytes` are
    per-call limits that only the code sandbox's helper applies.
    """

    argv: tuple[str, ...]
    limits: Limits = field(default_factory=Limits)
    # uid and gid it runs as (local: mapped in a user namespace).
    user: tuple[int, int] = (65534, 65534)
    home: str = "/work"
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    binds: tuple[Bind, ...] = ()
    # Guest path of a fresh host folder the guest may write, for unix sockets: Guest.socket_dir.
    socket_dir: str | None = None
    # Host device nodes it may use (e.g. /dev/dri/renderD128); the X socket is a Bind.
    devices: tuple[str, ...] = ()
    # Files placed read-only in its /etc, name -> content (e.g. passwd for its user).
    etc_files: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Host system paths it sees read-only, e.g. /etc/fonts (local only: an image has its own).
    host_system: tuple[str, ...] = ()
    # Docker image (None: the code sandbox's); the local backend uses the host's /usr.
    image: str | None = None
    # Capabilities a program started as root keeps, with no user namespace; it must drop
    # them itself (the helper does). Ignored when the owner is not root.
    root_caps: tuple[str, ...] = ()

    def environment(self) -> dict[str, str]:
        return {"PATH": PATH, **self.env}


def watched(spec: GuestSpec) -> GuestSpec:
    """`spec` with its program run under WATCH_STDIN."""
    return replace(spec, argv=("/bin/sh", "-c", WATCH_STDIN, "sh", *spec.argv))


_DIR_PREFIX = "parity-guest-"


def remove_orphan_dirs() -> None:
    """Remove the host folders of guests whose owner process is gone (killed before close)."""
    for path in Path(tempfile.gettempdir()).glob(f"{_DIR_PREFIX}*-*"):
        owner = path.name[len(_DIR_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(path, ignore_errors=True)


class Guest(ABC):
    """A running guest. `socket_dir` is the host path of its socket folder; `close()` kills
    every process it started and removes what it left on the host (idempotent)."""

    backend: str = ""

    def __init__(self, spec: GuestSpec) -> None:
        self.spec = spec
        remove_orphan_dirs()
        # Private to this guest: its socket folder, /etc files and log; named by the owner's
        # pid so a later owner can remove what a killed one left.
        self.host_dir = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-"))
        self.socket_dir: Path | None = None
        if spec.socket_dir is not None:
            self.socket_dir = self.host_dir / "run"
            self.socket_dir.mkdir()
            self.socket_dir.chmod(0o777)  # the guest's uid creates its sockets here
        for name, content in spec.etc_files.items():
            (self.host_dir / "etc").mkdir(exist_ok=True)
            (self.host_dir / "etc" / name).write_text(content)
        self.closed = False

    def binds(self) -> list[Bind]:
        """The spec's binds plus the socket folder and /etc files this guest provides."""
        out = list(self.spec.binds)
        if self.socket_dir is not None and self.spec.socket_dir is not None:
            out.append(Bind(str(self.socket_dir), self.spec.socket_dir, writable=True))
        out += [Bind(str(self.host_dir / "etc" / n), f"/etc/{n}") for n in self.spec.etc_files]
        return out

    @property
    @abstractmethod
    def pid(self) -> int | None:
        """Host pid of the sandbox's outermost process (bubblewrap, the container's init)."""

    @abstractmethod
    def running(self) -> bool:
        """Whether the guest program is still alive."""

    @abstractmethod
    def log_tail(self, chars: int = 2000) -> str:
        """The end of its stdout and stderr."""

    @abstractmethod
    def _destroy(self) -> None:
        """Kill every process of the sandbox and free what it holds."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._destroy()
        finally:
            shutil.rmtree(self.host_dir, ignore_errors=True)

    def __enter__(self) -> Guest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
