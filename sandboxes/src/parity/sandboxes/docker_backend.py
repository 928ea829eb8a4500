"""The `docker` backend: the helper as PID 1 of a locked-down container (docker SDK for Python).

The container has no network (`network_mode="none"`), memory == memory+swap, a CPU quota, a
pids limit, a read-only root with size-capped tmpfs /work and /tmp, no capabilities,
no-new-privileges, and runs as uid 65534. It is labelled `parity.sandbox=1` (plus its owner
host and pid) so `remove_stale_containers` can clean up after a crashed owner. The image is
built locally by scripts/build_sandbox_image.sh (sandboxes/docker/Dockerfile with a registry).
"""

from __future__ import annotations

import os
import socket
import struct
import time
import uuid
from collections.abc import Sequence
from typing import Any

from parity.sandboxes.guest import Bind, Guest, GuestSpec, watched
from parity.sandboxes.limits import Limits
from parity.sandboxes.result import SandboxError
from parity.sandboxes.sandbox import Sandbox, helper_argv

DEFAULT_IMAGE = os.environ.get("PARITY_SANDBOX_IMAGE", "parity-sandbox:bookworm")
LABEL = "parity.sandbox"
HOW_TO_START = (
    "start one with `bash scripts/docker_up.sh` (runs `dockerd --bridge=none` and builds the "
    "image) or point DOCKER_HOST at a running engine"
)


def docker_client() -> Any:
    """A client for the engine DOCKER_HOST names (default the local socket), checked to answer."""
    import docker

    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:
        raise SandboxError(f"no Docker engine answers ({exc}); {HOW_TO_START}") from exc
    return client


class AttachTransport:
    """The container's stdin/stdout through the engine's attach socket.

    Without a TTY the engine multiplexes stdout and stderr into frames of an 8-byte header
    (stream id, 3 zero bytes, big-endian length) and a payload; only stdout is the protocol.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._raw = bytearray()
        self._out = bytearray()
        self.stderr_tail = bytearray()

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def recv(self, n: int, deadline: float) -> bytes:
        while not self._out:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the sandbox helper did not answer in time")
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(1 << 16)
            except TimeoutError:
                raise TimeoutError("the sandbox helper did not answer in time") from None
            if not chunk:
                return b""
            self._raw += chunk
            self._demux()
        data = bytes(self._out[:n])
        del self._out[:n]
        return data

    def _demux(self) -> None:
        while len(self._raw) >= 8:
            stream, size = self._raw[0], struct.unpack(">I", self._raw[4:8])[0]
            if len(self._raw) < 8 + size:
                return
            payload = self._raw[8 : 8 + size]
            del self._raw[: 8 + size]
            if stream == 1:
                self._out += payload
            else:
                self.stderr_tail = (self.stderr_tail + payload)[-4096:]

    def close(self) -> None:
        self._sock.close()


def start_container(
    client: Any, spec: GuestSpec, binds: Sequence[Bind], keep: bool = False
) -> tuple[Any, socket.socket]:
    """Create and start the container of `spec` with all of the hardening; return it and its
    attach socket. Attached stdin with StdinOnce (what detach=False sets): when this process
    dies the engine closes the program's stdin. The socket also streams stdout and stderr
    here, and the container is removed when it exits; with `keep` neither: the engine keeps
    the output as the container's log, and the container until it is removed."""
    import docker

    lim = spec.limits
    uid, gid = spec.user
    tmpfs_opts = "nosuid,nodev"
    image = spec.image or DEFAULT_IMAGE
    try:
        api = client.api
        host_config = api.create_host_config(
            network_mode="none",
            mem_limit=f"{lim.memory_mb}m",
            memswap_limit=f"{lim.memory_mb}m",
            nano_cpus=int(lim.cpus * 1e9),
            pids_limit=lim.max_procs,
            read_only=True,
            tmpfs={
                spec.home: f"size={lim.disk_mb}m,uid={uid},gid={gid},mode=0755,{tmpfs_opts}",
                "/tmp": f"size={lim.disk_mb}m,mode=1777,{tmpfs_opts}",
            },
            shm_size=f"{min(lim.disk_mb, 64)}m",
            binds=[f"{b.host}:{b.guest}:{'rw' if b.writable else 'ro'}" for b in binds],
            devices=[f"{d}:{d}:rwm" for d in spec.devices],
            ulimits=[
                docker.types.Ulimit(name="core", soft=0, hard=0),
                docker.types.Ulimit(name="nofile", soft=lim.open_files, hard=lim.open_files),
                docker.types.Ulimit(name="fsize", soft=lim.disk_mb << 20, hard=lim.disk_mb << 20),
            ],
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            auto_remove=not keep,
        )
        created = api.create_container(
            image,
            command=list(spec.argv),
            name=f"parity-sb-{uuid.uuid4().hex[:12]}",
            user=f"{uid}:{gid}",
            working_dir=spec.home,
            environment=spec.environment(),
            hostname="sandbox",
            labels={LABEL: "1", f"{LABEL}.owner": f"{socket.gethostname()}:{os.getpid()}"},
            stdin_open=True,
            detach=False,
            host_config=host_config,
        )
        container = client.containers.get(created["Id"])
    except docker.errors.ImageNotFound as exc:
        raise SandboxError(
            f"sandbox image {image!r} is missing: build it (the code sandbox's with "
            "`bash scripts/build_sandbox_image.sh`, or `docker build -t "
            f"{DEFAULT_IMAGE} sandboxes/docker` where a registry is reachable)"
        ) from exc
    except docker.errors.DockerException as exc:
        raise SandboxError(f"could not start a sandbox container: {exc}") from exc
    try:
        output = 0 if keep else 1
        sock = api.attach_socket(
            container.id, params={"stdin": 1, "stdout": output, "stderr": output, "stream": 1}
        )
        container.start()
    except docker.errors.DockerException as exc:
        remove_container(container)
        raise SandboxError(f"could not start a sandbox container: {exc}") from exc
    return container, sock._sock


def remove_container(container: Any) -> None:
    """Remove a sandbox container, running or not, if it still exists."""
    import docker

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:  # auto-removal may have started first
        if "in progress" not in str(exc):
            raise


class DockerSandbox(Sandbox):
    """A container sandbox; see the module docstring for its settings."""

    backend = "docker"

    def __init__(
        self,
        limits: Limits | None = None,
        image: str = DEFAULT_IMAGE,
        client: Any = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(limits or Limits())
        self._container: Any = None
        self.client = client or docker_client()
        lim = self.limits
        spec = GuestSpec(
            # The container's cgroup bounds memory and pids; per-uid RLIMIT_NPROC would be
            # shared with every other container running as uid 65534 on the host.
            tuple(helper_argv("python3", {**lim.model_dump(), "rlimit_nproc": False})),
            lim.model_copy(update={"max_procs": lim.max_procs + 1}),  # + the helper
            env={"LANG": "C.UTF-8"},
            image=image,
        )
        # When this process dies the helper (PID 1) reads EOF and exits, the kernel kills
        # the rest and the engine removes the container.
        self._container, sock = start_container(self.client, spec, [])
        transport = AttachTransport(sock)
        try:
            self._connect(transport, start_timeout_s)
        except SandboxError as exc:
            said = transport.stderr_tail.decode(errors="replace").strip() or "(nothing)"
            self.close()
            raise SandboxError(f"{exc}; the container said: {said}") from exc

    @property
    def container_id(self) -> str:
        return self._container.id

    def _destroy(self) -> None:
        if self._container is not None:
            remove_container(self._container)
            self._container = None


def remove_stale_containers(client: Any = None) -> int:
    """Remove sandbox containers of this host whose owning process is gone; return how many."""
    client = client or docker_client()
    host = socket.gethostname()
    removed = 0
    # the listing's own labels, not `containers.list`, which inspects each container and fails
    # on one that another owner's close removed meanwhile (seen with 8+ desktops starting at once)
    for row in client.api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        owner_host, _, pid = (row.get("Labels") or {}).get(f"{LABEL}.owner", ":").partition(":")
        if owner_host == host and pid.isdigit() and not _pid_alive(int(pid)):
            remove_container(client.containers.prepare_model(row))
            removed += 1
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DockerGuest(Guest):
    """A guest program in a container (see GuestSpec); `container` is its docker-SDK object.

    It dies with its owner (see `watched`); its container is kept after it exits, for the
    log, until close(), and one whose owner died is removed by the next guest's start.
    """

    backend = "docker"

    def __init__(self, spec: GuestSpec, client: Any = None) -> None:
        super().__init__(spec)
        self.container: Any = None
        self._sock: socket.socket | None = None
        try:
            self.client = client or docker_client()
            remove_stale_containers(self.client)
            self.container, self._sock = start_container(
                self.client, watched(spec), self.binds(), keep=True
            )
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        try:
            self.container.reload()
            return int(self.container.attrs["State"]["Pid"]) or None
        except Exception:  # gone already
            return None

    def running(self) -> bool:
        try:
            self.container.reload()
        except Exception:  # removed, or the engine is gone
            return False
        return self.container.status in ("created", "running")

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.container.logs().decode("utf-8", "replace")[-chars:]
        except Exception:  # removed, or the engine is gone
            return ""

    def _destroy(self) -> None:
        if self.container is not None:
            remove_container(self.container)
        if self._sock is not None:
            self._sock.close()
