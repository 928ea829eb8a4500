"""parity.envs: the environment API (gymnasium, token-in-token-out), tool-call parsing,
rubric rewards, task data, and the Python-tool, math and desktop environments.

Importing this package registers `parity/PythonTool-v0`, `parity/Math-v0` and
`parity/Desktop-v0` with gymnasium. It stays light (the CLI imports it): the env classes
and the tokenizer behind them (`parity.envs.tokenizer`) load on first use, and torch not at
all.
"""

import importlib
from typing import Any

from parity.envs.registry import list_envs, make_env, register_env
from parity.envs.rubric import Criterion, Rubric

register_env(
    "parity/PythonTool-v0",
    "parity.envs.python_tool:PythonToolEnv",
    "Multi-turn: the model runs Python in a sandbox, reads the output, answers in <ans></ans>.",
)
register_env(
    "parity/Math-v0",
    "parity.envs.math_env:MathEnv",
    "Math problems answered in \\boxed{}, checked by math-verify (single- or multi-turn).",
)

import parity.envs.desktop  # noqa: E402, F401  (registers parity/Desktop-v0)

_LAZY = {"Episode": "parity.envs.episode", "EpisodeLimits": "parity.envs.episode",
         "Response": "parity.envs.core", "TextEnv": "parity.envs.core"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'parity.envs' has no attribute {name!r}")


__all__ = [
    "Criterion",
    "Episode",
    "EpisodeLimits",
    "Response",
    "Rubric",
    "TextEnv",
    "list_envs",
    "make_env",
    "register_env",
]
