"""A rollout worker's episodes lease warm sandboxes from one pool (`env.sandbox_pool`), on the
real local backend: one sandbox serves episode after episode, reset in between."""

from __future__ import annotations

import asyncio
from pathlib import Path

from parity.envs.registry import make_env
from parity.envs.runner import oracle_generate, run_episode
from parity.trainer.backends import sandbox_pool
from parity.trainer.config import TrainConfig

SMALL = {"rollout": {"group_size": 4, "max_groups_in_flight": 3}}


def _lends_one_sandbox(cfg: TrainConfig, kwargs: dict) -> None:
    """Three oracle episodes of `cfg`'s env, one after another as a worker's episodes come
    and go, all served by one warm sandbox of the worker's pool."""
    pool = sandbox_pool(cfg, kwargs)
    assert pool is not None

    async def episodes() -> list[float]:
        rewards = []
        for seed in range(3):
            env = make_env(cfg.env.id, **kwargs, sandbox_pool=pool)
            traj = await run_episode(env, oracle_generate(env), seed=seed)
            assert traj.failure is None and traj.num_turns == 2
            rewards.append(traj.reward)
            env.close()
        return rewards

    with pool:
        assert (pool.backend, pool.size, pool.limits.timeout_s) == ("local", 12, 10)
        assert asyncio.run(episodes()) == [1.0, 1.0, 1.0]
        assert (pool.created, pool.recycled) == (1, 0)


def test_the_embedded_env_lends_from_one_pool_sized_for_the_worker() -> None:
    cfg = TrainConfig.model_validate(SMALL)
    _lends_one_sandbox(cfg, dict(cfg.env.kwargs))


def test_no_pool_when_switched_off_or_the_kwargs_bring_their_sandboxes() -> None:
    off = TrainConfig.model_validate({**SMALL, "env": {"sandbox_pool": False}})
    assert sandbox_pool(off, dict(off.env.kwargs)) is None
    cfg = TrainConfig.model_validate(SMALL)
    own = {**cfg.env.kwargs, "sandbox_factory": lambda: None}
    assert sandbox_pool(cfg, own) is None


def test_no_pool_for_an_env_that_does_not_lend_from_one() -> None:
    cfg = TrainConfig.model_validate({"env": {"id": "parity/Math-v0", "kwargs": {}}})
    assert sandbox_pool(cfg, {}) is None


def test_an_agent_env_lends_its_tools_sandbox_from_the_pool(monkeypatch) -> None:
    """The agent example (its sandbox backend registered with it): one warm sandbox serves
    the agents' tool calls episode after episode."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    _lends_one_sandbox(TrainConfig.model_validate(
        {**SMALL, "env": {"id": "examples.agent_python_tool:parity/AgentPythonTool-v0"}}), {})
