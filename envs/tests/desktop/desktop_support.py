"""Helpers for the desktop tests: skip markers for missing packages, playing a task's solutions,
process lookup in a sandbox."""

from __future__ import annotations

import os
import shutil

import pytest

from parity.envs.desktop.env import DesktopEnv
from parity.envs.desktop.solutions import play
from parity.envs.desktop.tasks import Task

NEEDED = ("bwrap", "Xvfb", "xdotool", "xprop", "xwininfo", "openbox", "xterm")
MISSING = [p for p in NEEDED if shutil.which(p) is None]
needs_desktop = pytest.mark.skipif(
    bool(MISSING), reason=f"desktop packages missing: {MISSING} (apt-get install bubblewrap xvfb xdotool "
                          "x11-utils openbox xterm python3-tk)")

APP_BINARIES = {"libreoffice_calc": "soffice", "libreoffice_writer": "soffice",
                "libreoffice_impress": "/usr/lib/libreoffice/program/simpress", "pcmanfm": "pcmanfm",
                "firefox": "firefox-esr", "mousepad": "mousepad", "gimp": "gimp", "vlc": "vlc",
                "thunderbird": "thunderbird", "chromium": "/usr/lib/chromium/chromium",
                "atspi": "/usr/libexec/at-spi2-registryd"}
"""The real applications' tasks (by related app) and the program each needs (and AT-SPI's registry)."""


def needs_apps(apps: list[str]) -> list[pytest.MarkDecorator]:
    """A skip marker for a task whose real applications are not installed (never in CI, where
    PARITY_REQUIRE_DOCKER=1 and .ci/run installs them)."""
    missing = sorted({APP_BINARIES[a] for a in apps if a in APP_BINARIES and shutil.which(APP_BINARIES[a]) is None
                      and not os.path.exists(APP_BINARIES[a])})
    if not missing or os.environ.get("PARITY_REQUIRE_DOCKER") == "1":
        return []
    return [pytest.mark.skip(reason=f"{missing} missing (apt-get install --no-install-recommends "
                                    "libreoffice-calc libreoffice-writer libreoffice-impress pcmanfm firefox-esr "
                                    "mousepad gimp vlc thunderbird chromium at-spi2-core libatk-adaptor "
                                    "python3-pyatspi)")]


def task_param(task: Task) -> object:
    """A task id as a test parameter, skipped where its applications are missing."""
    return pytest.param(task.id, marks=needs_apps(task.related_apps))


def check_solutions(env: DesktopEnv, task_id: str) -> None:
    """The task's oracle scores 1 and its wrong solution 0; every step is timed, and only the
    last one (DONE) evaluates."""
    oracle, timings = play(env, task_id, "oracle")
    wrong, _ = play(env, task_id, "wrong")
    assert (oracle, wrong) == (1.0, 0.0), f"{task_id}: the oracle scored {oracle}, the wrong solution {wrong}"
    for timing in timings[1:]:
        assert set(timing) == {"parse_s", "action_s", "settle_s", "screenshot_s", "eval_s", "overhead_s", "step_s"}
        assert timing["overhead_s"] >= 0
    assert timings[-1]["eval_s"] > 0 and timings[-2]["eval_s"] == 0.0


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
