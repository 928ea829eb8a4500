"""The example in docs/environments.md runs as written."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import gymnasium as gym

DOC = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def test_new_env_example(tmp_path, monkeypatch) -> None:
    text = DOC.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    module = next(b for b in blocks if "class ReverseEnv" in b)
    usage = next(b for b in blocks if "check_env(env.unwrapped)" in b)
    toml = tomllib.loads(re.findall(r"```toml\n(.*?)```", text, flags=re.S)[0])
    assert len(module.splitlines()) + len(usage.splitlines()) + 4 < 50
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs" / "__init__.py").write_text("")
    (tmp_path / "my_envs" / "reverse.py").write_text(module)
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
