"""Per-sandbox memory and pids cgroups for the local backend (cgroup v2, or v1 hierarchies).

A local sandbox joins its cgroup before bubblewrap starts (see local.py), so every process it
ever creates is counted and can be found and killed. Machines without writable cgroups get
None from `create_cgroup`, and the local backend falls back to per-process rlimits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PARENT = "parity-sandboxes"


@dataclass
class Cgroup:
    """The cgroup directories of one sandbox: one on v2, one per controller on v1."""

    dirs: list[Path]
    memory_dir: Path

    @property
    def procs_files(self) -> list[Path]:
        """Files a process writes its pid to, to join (all of them on v1)."""
        return [d / "cgroup.procs" for d in self.dirs]

    def oom_kills(self) -> int:
        """OOM kills so far in this cgroup."""
        for name in ("memory.events", "memory.oom_control"):
            try:
                for line in (self.memory_dir / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
            except OSError:
                continue
        return 0

    def pids(self) -> set[int]:
        out: set[int] = set()
        for f in self.procs_files:
            try:
                out |= {int(p) for p in f.read_text().split()}
            except OSError:
                continue
        return out

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup until none is left (forks race the first pass)."""
        kill_file = self.dirs[0] / "cgroup.kill"
        if kill_file.exists():
            kill_file.write_text("1")
        for _ in range(200):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(100):  # a killed process leaves the cgroup a moment after it dies
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def _v2_parent() -> Path | None:
    controllers = (ROOT / "cgroup.controllers").read_text().split()
    if not {"memory", "pids"} <= set(controllers):
        return None
    parent = ROOT / PARENT
    parent.mkdir(exist_ok=True)
    enabled = (ROOT / "cgroup.subtree_control").read_text().split()
    if not {"memory", "pids"} <= set(enabled):
        (ROOT / "cgroup.subtree_control").write_text("+memory +pids")
    if not {"memory", "pids"} <= set((parent / "cgroup.subtree_control").read_text().split()):
        (parent / "cgroup.subtree_control").write_text("+memory +pids")
    return parent


def create_cgroup(name: str, memory_bytes: int, max_pids: int) -> Cgroup | None:
    """Make the cgroup(s) of sandbox `name` with its limits, or None when this machine cannot."""
    try:
        cgroup = _create(name, memory_bytes, max_pids)
    except OSError:
        return None
    remove_stale_cgroups()
    return cgroup


def remove_stale_cgroups(min_age_s: float = 60.0) -> None:
    """Remove the empty cgroups left by owners killed before they could close their sandboxes.

    The kernel refuses to remove a cgroup that still has processes; the age guard spares a
    cgroup another process just made and has not joined yet.
    """
    now = time.time()
    for parent in (ROOT / PARENT, ROOT / "memory" / PARENT, ROOT / "pids" / PARENT):
        if not parent.is_dir():
            continue
        for d in parent.iterdir():
            if d.is_dir() and d.name.startswith("sb-"):
                try:
                    if now - d.stat().st_mtime > min_age_s and not (d / "cgroup.procs").read_text():
                        d.rmdir()
                except OSError:
                    continue


def cgroup_support() -> str | None:
    """None when per-sandbox cgroups work here, else why not."""
    probe = f"probe-{os.getpid()}-{time.monotonic_ns()}"
    try:
        cg = _create(probe, 64 << 20, 8)
    except OSError as exc:
        return f"cannot create memory/pids cgroups under {ROOT} ({exc})"
    if cg is None:
        return f"no writable memory and pids cgroup controllers under {ROOT}"
    cg.remove()
    return None


def _create(name: str, memory_bytes: int, max_pids: int) -> Cgroup | None:
    if (ROOT / "cgroup.controllers").exists():  # unified (v2) hierarchy
        parent = _v2_parent()
        if parent is None:
            return None
        d = parent / name
        d.mkdir()
        (d / "memory.max").write_text(str(memory_bytes))
        if (d / "memory.swap.max").exists():
            (d / "memory.swap.max").write_text("0")
        (d / "pids.max").write_text(str(max_pids))
        return Cgroup([d], d)
    mem, pids = ROOT / "memory", ROOT / "pids"
    if not (mem / "cgroup.procs").exists() or not (pids / "cgroup.procs").exists():
        return None
    dirs = []
    try:
        for hierarchy in (mem, pids):
            (hierarchy / PARENT).mkdir(exist_ok=True)
            d = hierarchy / PARENT / name
            d.mkdir()
            dirs.append(d)
        mem_dir, pids_dir = dirs
        (mem_dir / "memory.limit_in_bytes").write_text(str(memory_bytes))
        if (mem_dir / "memory.memsw.limit_in_bytes").exists():
            (mem_dir / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        (pids_dir / "pids.max").write_text(str(max_pids))
    except OSError:
        for d in dirs:
            d.rmdir()
        raise
    return Cgroup(dirs, dirs[0])
