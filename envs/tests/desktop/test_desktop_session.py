"""The session's supervision of its window manager and AT-SPI daemons, without a display
(stand-in processes for Xvfb, openbox and the daemons): a window manager that aborts is started
again, one that cannot start or that was killed is reported dead, and so is a lost AT-SPI daemon."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from parity.envs.desktop.guest import session as guest_session
from parity.envs.desktop.guest.session import WM_STARTS, Session, SessionError


def _exited(argv: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(argv)
    proc.wait()
    return proc


def _aborted() -> subprocess.Popen:
    """A process that died of SIGABRT, as openbox at the pids limit."""
    return _exited(["sh", "-c", "kill -ABRT $$"])


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The session's sleeps, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(guest_session, "time", SimpleNamespace(sleep=slept.append, monotonic=time.monotonic))
    return slept


@pytest.fixture
def session(tmp_path: Path, waits: list[float]) -> Iterator[Session]:
    """A session whose X server runs (a sleeper) and whose window manager has aborted."""
    s = Session(str(tmp_path / "run"), str(tmp_path), 64, 48)
    s.xvfb, s.wm = subprocess.Popen(["sleep", "60"]), _aborted()
    yield s
    for proc in (s.xvfb, s.wm):
        proc.kill()
        proc.wait()


def test_a_window_manager_that_aborted_is_started_again(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    starts: list[float] = []

    def start(timeout: float) -> None:
        starts.append(timeout)
        session.wm = subprocess.Popen(["sleep", "60"])

    monkeypatch.setattr(session, "_start_wm", start)
    assert session.dead() is None and len(starts) == 1
    assert session.dead() is None and len(starts) == 1  # it runs: not started twice


def test_a_window_manager_that_cannot_start_ends_up_dead(
    session: Session, waits: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    starts: list[float] = []

    def start(timeout: float) -> None:
        starts.append(timeout)
        raise SessionError("openbox exited during start (code 1)")

    monkeypatch.setattr(session, "_start_wm", start)
    why = "window manager exited with code -6 and did not start again (openbox exited during start (code 1))"
    assert session.dead() == why and len(starts) == WM_STARTS
    assert waits == [0.5, 1, 2, 4, 8]  # longer each time
    assert session.dead() == why and len(starts) == WM_STARTS  # given up: no more tries


def test_a_window_manager_is_not_started_without_its_x_server(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    session.xvfb.kill()  # type: ignore[union-attr]
    session.xvfb.wait()  # type: ignore[union-attr]
    monkeypatch.setattr(session, "_start_wm", lambda timeout: pytest.fail("started without X"))
    assert session.dead() == "X server exited with code -9"


def test_a_window_manager_killed_from_outside_is_not_started_again(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    session.wm = _exited(["sh", "-c", "kill -KILL $$"])
    monkeypatch.setattr(session, "_start_wm", lambda timeout: pytest.fail("started again"))
    assert session.dead() == "window manager exited with code -9"


def test_a_lost_accessibility_daemon_is_a_dead_desktop(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "_start_wm", lambda timeout: setattr(session, "wm", subprocess.Popen(["sleep", "60"])))
    registry = subprocess.Popen(["sleep", "60"])
    session.support = [registry]
    assert session.dead() is None
    registry.kill()
    registry.wait()
    assert session.dead() == "accessibility daemon sleep exited with code -9"
