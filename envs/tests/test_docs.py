"""The example in docs/environments.md runs as written: in-process, and through the `parity`
CLI as a user runs it (from the directory holding `my_envs/`, without PYTHONPATH)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import gymnasium as gym
import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "environments.md"
PARITY = Path(sys.executable).parent / "parity"  # the venv's console script


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def _walkthrough(tmp: Path) -> Path:
    """`tmp` as the user's working directory: `my_envs/reverse.py` (no `__init__.py`) and
    `reverse.toml`, both from the doc."""
    (tmp / "my_envs").mkdir()
    (tmp / "my_envs" / "reverse.py").write_text(next(b for b in _blocks("python") if "class ReverseEnv" in b))
    (tmp / "reverse.toml").write_text(next(b for b in _blocks("toml") if "reverse.toml" in b))
    return tmp


def _doc_command(prefix: str) -> list[str]:
    """The walkthrough's command starting with `prefix`, as the doc writes it, less `uv run`."""
    section = DOC.read_text().split("## A new environment", 1)[1].split("\n## ", 1)[0]
    lines = [ln.strip() for ln in section.splitlines() if ln.strip().startswith(prefix)]
    assert len(lines) == 1, (prefix, lines)
    args = shlex.split(lines[0])
    assert args[:3] == ["uv", "run", "parity"]
    return args[3:]


def _parity(args: list[str], cwd: Path, stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as the user has it
    return subprocess.run([str(PARITY), *args], cwd=cwd, env=env, input=stdin, text=True,
                          capture_output=True, timeout=timeout)


def test_new_env_example(tmp_path, monkeypatch) -> None:
    module = next(b for b in _blocks("python") if "class ReverseEnv" in b)
    usage = next(b for b in _blocks("python") if "check_env(env.unwrapped)" in b)
    toml = tomllib.loads(next(b for b in _blocks("toml") if "reverse.toml" in b))
    assert len(module.splitlines()) + len(usage.splitlines()) + 4 < 50
    _walkthrough(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        exec(compile(usage, str(DOC), "exec"), {})
        # the trainer's config section makes the same env
        env = gym.make(toml["env"]["id"], **toml["env"]["kwargs"])
        assert env.unwrapped.length == 4
        env.close()
    finally:
        sys.modules.pop("my_envs.reverse", None)
        sys.modules.pop("my_envs", None)
        gym.registry.pop("parity/Reverse-v0", None)


def test_walkthrough_envs_check_and_play_via_cli(tmp_path) -> None:
    cwd = _walkthrough(tmp_path)
    check = _doc_command("uv run parity envs check")
    assert check == ["envs", "check", "my_envs.reverse:parity/Reverse-v0"]
    res = _parity(check, cwd)
    assert res.returncode == 0, res.stderr
    assert "ok: True" in res.stdout
    # a wrong answer: the episode ends, showing the expected one for a word of --kwarg length
    play = _doc_command("uv run parity envs play")
    assert play == ["envs", "play", "my_envs.reverse:parity/Reverse-v0", "--kwarg", "length=4"]
    res = _parity(play, cwd, stdin="wrong\n")
    assert res.returncode == 0, res.stderr
    word = re.search(r"user> Reverse: (\w+)", res.stdout).group(1)
    assert len(word) == 4
    assert "episode over: reward=0.0 finish_reason=answer" in res.stdout
    assert f"expected answer: {word[::-1]}" in res.stdout
    res = _parity([*check, "--kwarg", "length=3", "--json"], cwd)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["kwargs"] == {"length": 3}


@pytest.mark.parametrize("source", [None, "import this_package_does_not_exist\n", "def f(:\n"])
def test_envs_check_of_a_module_that_does_not_import_is_one_line(tmp_path, source) -> None:
    if source is not None:  # the module exists but fails as it is imported
        (tmp_path / "my_envs").mkdir()
        (tmp_path / "my_envs" / "broken.py").write_text(source)
    name = "my_envs.broken:parity/Broken-v0"
    res = _parity(["envs", "check", name], tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "'my_envs.broken'" in lines[0] and str(tmp_path) in lines[0]


@pytest.mark.slow  # a real run on a local Ray: about 25 s on 2 cores
def test_walkthrough_train_via_cli(tmp_path) -> None:
    cwd = _walkthrough(tmp_path)
    train = _doc_command("uv run parity train")
    assert train == ["train", "reverse.toml"]
    out = tmp_path / "run"
    res = _parity([*train, "--out", str(out),
                   "--set", "train.steps=1", "--set", "rollout.group_size=2",
                   "--set", "rollout.groups_per_step=1", "--set", "rollout.max_groups_in_flight=1",
                   "--set", "rollout.max_new_tokens=8", "--set", "eval.heldout_episodes=0",
                   "--set", "output.plots=false", "--set", "output.tensorboard=false",
                   "--set", "output.progress=false"], cwd, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [0]
    assert "reward/components/exact" in recs[0]  # the workers imported my_envs.reverse


def test_train_with_a_missing_env_module_is_one_line_and_exit_2(tmp_path) -> None:
    (tmp_path / "nope.toml").write_text('[env]\nid = "my_envs.nope:parity/Reverse-v0"\n')
    res = _parity(["train", "nope.toml", "--out", str(tmp_path / "run")], tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "'my_envs.nope'" in lines[0] and "No module named 'my_envs'" in lines[0]
