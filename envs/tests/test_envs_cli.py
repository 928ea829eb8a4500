"""`parity envs list|check|play`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from parity.envs import list_envs
from parity.envs.cli import app

runner = CliRunner()


def test_list_json() -> None:
    res = runner.invoke(app, ["list", "--json"])
    assert res.exit_code == 0
    envs = {e["id"]: e for e in json.loads(res.stdout)}
    assert {"parity/PythonTool-v0", "parity/Math-v0"} <= set(envs)
    assert all(e["description"] and "\n" not in e["description"] for e in envs.values())


def test_list_text() -> None:
    res = runner.invoke(app, ["list"])
    assert res.exit_code == 0
    assert "parity/Math-v0" in res.stdout and "math-verify" in res.stdout


@pytest.mark.parametrize("env_id", sorted(e["id"] for e in list_envs()))
def test_check_passes_for_every_shipped_env(env_id: str) -> None:
    """Every registered env passes gymnasium's checker and its oracle reaches the expected
    reward (the desktops run on the local backend here: Xvfb in bubblewrap)."""
    res = runner.invoke(app, ["check", env_id, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["check_env"] == "ok" and report["ok"] is True
    assert report["oracle_reward"] == report["oracle_expected"] == 1.0


def test_check_unknown_env() -> None:
    res = runner.invoke(app, ["check", "parity/Nope-v0"])
    assert res.exit_code == 2
    assert "unknown environment 'parity/Nope-v0'" in res.output


def test_play_by_hand() -> None:
    res = runner.invoke(app, ["play", "parity/PythonTool-v0", "--seed", "3", "--oracle"],
                        input="<py>print(6*7)</py>\n<ans>1</ans>\n")
    assert res.exit_code == 0, res.output
    assert "tool> 42" in res.output
    assert "episode over: reward=0.0 finish_reason=answer" in res.output
    res = runner.invoke(app, ["play", "parity/PythonTool-v0"], input="")
    assert "(end of input)" in res.output
