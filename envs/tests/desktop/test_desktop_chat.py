"""`parity/DesktopText-v0`: the desktop tasks through the token-in-token-out TextEnv API."""

from __future__ import annotations

import os
import signal
import time

import pytest
from desktop_support import guest_pid, needs_apps, needs_desktop

from parity.envs import make_env
from parity.envs.desktop.chat import DesktopTextEnv
from parity.envs.desktop.client import DesktopDeadError

pytestmark = needs_desktop


def test_oracle_turns_score_one_and_giving_up_scores_zero() -> None:
    """(gymnasium's check_env runs on parity/DesktopText-v0 in envs/tests/test_envs_cli.py.)"""
    env = make_env("parity/DesktopText-v0", backend="local")
    assert isinstance(env.unwrapped, DesktopTextEnv)
    try:
        obs, _ = env.reset(options={"task": {"task_id": "files-rename"}})
        assert obs["messages"][1]["content"].startswith("In the file manager, rename a.txt to b.txt.")
        assert "list-item\ta.txt" in obs["messages"][1]["content"] and obs["token_ids"]
        done, reward = False, 0.0
        while not done:
            obs, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
            done = terminated or truncated
        assert (reward, info["finish_reason"]) == (1.0, "done")
        env.reset(options={"task": {"task_id": "files-rename"}})
        obs, *_ = env.step("pyautogui.click(99999, 1)")
        assert obs["messages"][0]["content"].startswith("error: coordinate x=99999 is off screen")
        _, reward, terminated, _, info = env.step("FAIL")
        assert (reward, terminated, info["metrics"]["parse_errors"]) == (0.0, True, 1.0)
    finally:
        env.close()


def test_max_turns_evaluates_the_desktop_as_it_is() -> None:
    env = make_env("parity/DesktopText-v0", backend="local", limits={"max_turns": 1})
    try:
        env.reset(options={"task": {"task_id": "terminal-write-answer"}})
        _, reward, terminated, truncated, info = env.step("pyautogui.write('echo 42 > ~/answer.txt\\n')")
        assert (reward, terminated, truncated, info["finish_reason"]) == (1.0, False, True, "max_turns")
    finally:
        env.close()


@pytest.mark.parametrize("process", ["openbox --config-file", pytest.param("at-spi2-registryd", marks=needs_apps(["atspi"])),
                                     pytest.param("accessibility.conf", marks=needs_apps(["atspi"]))])  # AT-SPI's bus
def test_a_desktop_whose_window_manager_or_tree_dies_fails_the_episode_and_is_replaced(process: str) -> None:
    env = make_env("parity/DesktopText-v0", backend="local")
    desktop = env.unwrapped.desktop  # type: ignore[attr-defined]
    try:
        env.reset(options={"task": {"task_id": "files-rename"}})
        old = desktop.sandbox
        os.kill(guest_pid(old.guest.pid, process), signal.SIGKILL)
        deadline = time.monotonic() + 30  # the bus's launcher exits once it sees its bus gone
        while time.monotonic() < deadline:
            try:
                desktop.client.health()
            except DesktopDeadError:
                break
            time.sleep(0.05)
        _, reward, terminated, truncated, info = env.step("WAIT")
        assert (reward, terminated, truncated, info["finish_reason"]) == (0.0, False, True, "desktop_failed")
        assert env.unwrapped.episode.failure == "sandbox"  # type: ignore[attr-defined]  # env/failures, not a 0
        assert desktop.sandbox is None and not old.running()
        obs, _ = env.reset(options={"task": {"task_id": "files-rename"}})
        assert desktop.sandbox is not old and "list-item\ta.txt" in obs["messages"][1]["content"]
    finally:
        env.close()
