"""Bring your own agent: a program written against the OpenAI API, played as an env.

`AgentEnv` (`parity.envs.agent.env`) runs the agent; the worker's loopback endpoint
(`parity.envs.agent.server`) serves its model calls from the engine, one base URL per
episode; the session (`parity.envs.agent.session`) keeps each episode's tokens exactly as
sampled. docs/agents.md shows a whole agent.
"""

import importlib
from typing import Any

_LAZY = ("MODEL", "AgentEnv", "run_agent_episode")


def __getattr__(name: str) -> Any:  # `parity bench agent` loads this package with the CLI
    if name in _LAZY:
        return getattr(importlib.import_module("parity.envs.agent.env"), name)
    raise AttributeError(f"module 'parity.envs.agent' has no attribute {name!r}")


__all__ = ["MODEL", "AgentEnv", "run_agent_episode"]
