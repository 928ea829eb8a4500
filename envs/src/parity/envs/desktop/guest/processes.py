"""The desktop server's view of its processes (from /proc) and of its files: what a session's
reset needs to find every process it started, daemons included, and to empty the home."""

from __future__ import annotations

import ctypes
import os
import shutil
import time
from collections.abc import Iterator


def become_subreaper() -> None:
    """Adopt orphaned descendants (daemons that double-fork), so reset can find and kill them."""
    pr_set_child_subreaper = 36
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _processes() -> Iterator[tuple[int, str, int]]:
    """(pid, state, parent pid) of every process in /proc; one that exits meanwhile is skipped."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        yield int(entry), state, int(ppid)


def descendants_of(roots: set[int]) -> set[int]:
    """Every process below any of `roots` (by parent links in /proc)."""
    children: dict[int, list[int]] = {}
    for pid, _, ppid in _processes():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def descendants(root: int) -> set[int]:
    """Every process below `root`."""
    return descendants_of({root})


def zombie_children(parent: int) -> set[int]:
    """The exited, not yet reaped children of `parent` (state Z in /proc)."""
    return {pid for pid, state, ppid in _processes() if state == "Z" and ppid == parent}


def remove_path(path: str) -> None:
    """Remove a file or a tree. The window manager, which reset keeps, may be writing its
    font cache under the home at that moment ("Directory not empty"): try again briefly."""
    for _ in range(20):
        try:
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    shutil.rmtree(path, ignore_errors=True)
