"""Fixtures for the desktop tests: one local desktop env shared by a module's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from parity.envs.desktop.env import DesktopEnv


@pytest.fixture(scope="module")
def env() -> Iterator[DesktopEnv]:
    """A local-backend env shared by a module's tests (reset in place between episodes)."""
    e = DesktopEnv(backend="local", obs_mode="screenshot_a11y_tree")
    yield e
    e.close()
