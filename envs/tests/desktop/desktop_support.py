"""Helpers for the desktop tests: skip markers for missing packages, process lookup in a sandbox."""

from __future__ import annotations

import os
import shutil

import pytest

NEEDED = ("bwrap", "Xvfb", "xdotool", "xprop", "xwininfo", "openbox", "xterm")
MISSING = [p for p in NEEDED if shutil.which(p) is None]
needs_desktop = pytest.mark.skipif(
    bool(MISSING), reason=f"desktop packages missing: {MISSING} (apt-get install bubblewrap xvfb xdotool "
                          "x11-utils openbox xterm python3-tk)")

APP_BINARIES = {"libreoffice_calc": "soffice", "libreoffice_writer": "soffice", "pcmanfm": "pcmanfm",
                "firefox": "firefox-esr", "mousepad": "mousepad", "atspi": "/usr/libexec/at-spi2-registryd"}
"""The real applications' tasks (by related app) and the program each needs (and AT-SPI's registry)."""


def needs_apps(apps: list[str]) -> list[pytest.MarkDecorator]:
    """A skip marker for a task whose real applications are not installed (never in CI, where
    PARITY_REQUIRE_DOCKER=1 and .ci/run installs them)."""
    missing = sorted({APP_BINARIES[a] for a in apps if a in APP_BINARIES and shutil.which(APP_BINARIES[a]) is None
                      and not os.path.exists(APP_BINARIES[a])})
    if not missing or os.environ.get("PARITY_REQUIRE_DOCKER") == "1":
        return []
    return [pytest.mark.skip(reason=f"{missing} missing (apt-get install --no-install-recommends "
                                    "libreoffice-calc libreoffice-writer pcmanfm firefox-esr mousepad at-spi2-core "
                                    "libatk-adaptor python3-pyatspi)")]


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    return children


def guest_pid(root: int, needle: str) -> int:
    """The host pid of the process below `root` whose command line contains `needle`."""
    children, stack = _children(), [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode()
        except OSError:
            cmdline = ""
        if needle in cmdline and pid != root:
            return pid
        stack.extend(children.get(pid, []))
    raise LookupError(f"no process matching {needle!r} below {root}")
