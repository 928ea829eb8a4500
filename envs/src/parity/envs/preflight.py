"""Can an environment run here? Its oracle plays one real episode and must reach the expected
reward.

    report = oracle_episode(make_env("parity/Math-v0"), seed=0)   # an OracleReport
    preflight("parity/PythonTool-v0", {"backend": "local"})      # raises EnvPreflightError

A sandbox that cannot start, a verifier that crashes or a task file the env cannot use shows
here in seconds, as one line naming the env and what it said, instead of as a training run
whose every tool call fails and whose reward stays 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ORACLE_REWARD = 1.0  # what an env's oracle episode must score: the top reward


class EnvPreflightError(RuntimeError):
    """The env's oracle episode did not reach its expected reward on this machine."""


class EnvConfigError(ValueError):
    """The env cannot be made from its id and keyword arguments (bad input, not a fault)."""


@dataclass
class OracleReport:
    """One oracle episode: its reward against the expected one, and what went wrong if short."""

    env_id: str
    reward: float
    expected: float
    turns: int
    finish_reason: str
    said: str = ""  # the env's last error-looking observation (or last observation)
    failure: str | None = None  # the kind of failure outside the agent that ended it

    @property
    def ok(self) -> bool:
        return self.failure is None and self.reward >= self.expected

    def problem(self) -> str:
        said = f"; the env said: {self.said}" if self.said else ""
        if self.failure is not None:
            return (f"env {self.env_id} cannot run here: its oracle episode failed "
                    f"({self.failure}): {self.finish_reason}{said}")
        return (f"env {self.env_id} cannot run here: its oracle episode scored {self.reward:g} "
                f"(expected {self.expected:g}, finish reason {self.finish_reason!r}){said}")


def oracle_episode(env: Any, seed: int = 0, env_id: str = "") -> OracleReport:
    """Play one episode with the env's oracle: through the token-level runner for a TextEnv,
    through plain step() for any other env with `oracle_action()`."""
    from parity.envs.core import TextEnv
    from parity.envs.runner import oracle_generate, run_episode

    env_id = env_id or type(env.unwrapped).__name__
    expected = ORACLE_REWARD
    if isinstance(env.unwrapped, TextEnv):
        traj = asyncio.run(run_episode(env, oracle_generate(env), seed=seed))
        said = _env_said(traj.messages)
        return OracleReport(env_id, traj.reward, expected, traj.num_turns, traj.finish_reason, said,
                            traj.failure)
    if not hasattr(env.unwrapped, "oracle_action"):
        raise EnvPreflightError(f"env {env_id} has no oracle (no oracle_action()): it cannot be "
                                "checked before training")
    env.reset(seed=seed)
    turns, done, reward, info = 0, False, 0.0, {}
    while not done:
        _, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
        turns, done = turns + 1, terminated or truncated
    said = _one_line(str(info.get("failure") or info.get("error") or ""))
    return OracleReport(env_id, float(reward), expected, turns, info.get("finish_reason", ""), said)


def make_configured(env_id: str, kwargs: Mapping[str, Any]) -> Any:
    """`make_env(env_id, **kwargs)`; EnvConfigError naming the setting if it cannot be made
    (an unknown id, a "module:id" whose module does not import, a bad argument or task
    file)."""
    from parity.envs.registry import EnvImportError, UnknownEnvError, make_env

    try:
        return make_env(env_id, **kwargs)
    except (UnknownEnvError, EnvImportError) as e:  # the id's own fault, not its kwargs'
        raise EnvConfigError(f"env.id: {e}") from e
    except (ValueError, TypeError) as e:  # the env's own check of its arguments and tasks
        raise EnvConfigError(f"env.kwargs of {env_id}: {e}") from e


def preflight(env_id: str, kwargs: Mapping[str, Any], seed: int = 0) -> OracleReport:
    """Make `env_id` with `kwargs` (`make_configured`), play its oracle once, and raise
    EnvPreflightError unless it reaches the expected reward."""
    env = make_configured(env_id, kwargs)
    try:
        report = oracle_episode(env, seed, env_id)
    finally:
        env.close()
    if not report.ok:
        raise EnvPreflightError(report.problem())
    return report


def _env_said(messages: list[dict]) -> str:
    """The first env-side message after the model's first turn that reports an error, else
    the last env-side message."""
    roles = [m.get("role") for m in messages]
    first = roles.index("assistant") if "assistant" in roles else len(messages)
    env_side = [m["content"] for m in messages[first:] if m.get("role") != "assistant"]
    errors = [c for c in env_side if "error" in c.lower()]
    return _one_line(errors[0] if errors else (env_side or [""])[-1])


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
