"""`AgentEnv`: a program written against the OpenAI API, played as an environment.

    async def run(client, task) -> float:      # client: openai.AsyncOpenAI for this episode
        r = await client.chat.completions.create(model="policy", messages=[...])
        return reward

    env = AgentEnv(agent=run, task_source="my_tasks:draw")    # or command=["node", "agent.js"]
    traj = await run_agent_episode(env, generate, seed=7, sampling=SamplingParams())

Each episode gets its own base URL on the worker's loopback endpoint
(`parity.envs.agent.server`); every model call the agent makes there is one model turn of
the episode, sampled by `generate` (the same engine `run_episode` uses) and recorded token
for token (`parity.envs.agent.session`). The agent's return value is the reward. A command
line agent gets the base URL in `OPENAI_BASE_URL` (and `OPENAI_API_KEY`, `OPENAI_MODEL`,
the task as JSON in `PARITY_TASK`) and prints its reward as the last line of its output.

What ends an episode as a failure (`Trajectory.failure`, left out of training): the agent
raising or its command failing ("env_error"), running past `limits.timeout_s` ("timeout"),
returning a reward that is not a finite number ("reward_error"), never calling the model
("no_model_call"), or the engine raising ("generate_error").

Segments: an agent that rewrites its history starts a new segment (see the session). The
episode's `Trajectory` is its last segment, the one that led to the reward, with the ones
before it in `earlier` (`traj.segments`: all of them, in order, each with the episode's
reward); the learner trains every segment, the episode counted once. Its metrics count
`agent/segments` (and `agent/requests`, `agent/refused`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from parity.core.types import SamplingParams, Trajectory
from parity.envs.agent.server import endpoint
from parity.envs.agent.session import AgentSession
from parity.envs.core import Response, TextEnv
from parity.envs.data import Task
from parity.envs.episode import Episode, Message
from parity.envs.held_sandbox import HeldSandbox
from parity.envs.registry import _import_env_module
from parity.envs.rubric import Rubric
from parity.envs.runner import Generate

log = logging.getLogger(__name__)

MODEL = "policy"  # the model name an agent's requests use


def resolve(target: Any, what: str) -> Any:
    """`target`, or the object a "module:attribute" string names (as a TOML config gives it;
    the module is found in the working directory too, as an env id's)."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"{what}: {target!r} is not 'module:attribute'")
    _import_env_module(module, target)
    return getattr(sys.modules[module], attr)


class AgentSandbox(HeldSandbox):
    """The episode's sandbox for the agent's tools (`parity.sandboxes`), opened on first use
    (or leased from the worker's warm `pool`) and closed (or given back) when the episode
    ends."""

    def __init__(self, backend: str, limits: Mapping[str, Any], pool: Any = None) -> None:
        def open_sandbox() -> Any:
            from parity.sandboxes import open_sandbox

            return open_sandbox(backend, tool_limits(limits))

        super().__init__(open_sandbox, pool)

    async def run_python(self, code: str) -> Any:
        """Run `code` in a fresh process of the sandbox; its `ExecResult`."""
        return await (await self.get()).arun_python(code)

    async def close(self) -> None:
        await self.release()


def tool_limits(limits: Mapping[str, Any]) -> Any:
    """`parity.sandboxes.Limits` of an AgentEnv's `sandbox_limits` (10 s per call unless
    they say otherwise)."""
    from parity.sandboxes import Limits

    return Limits(**{"timeout_s": 10, **limits})


class AgentEnv(TextEnv):
    """Any program written against the OpenAI API; its return value is the reward."""

    required_fields = ()
    field_types: dict[str, tuple[type, ...]] = {}  # noqa: RUF012 (TextEnv's convention)

    def __init__(
        self,
        *,
        agent: Callable[..., Any] | str | None = None,
        command: Sequence[str] | None = None,
        task_source: Callable[..., Task] | str | None = None,
        task_kwargs: Mapping[str, Any] | None = None,
        oracle: Callable[[Episode], str] | str | None = None,
        sandbox_backend: str | None = None,
        sandbox_limits: Mapping[str, Any] | None = None,
        sandbox_pool: Any = None,
        model: str = MODEL,
        max_segments: int = 4,
        **kwargs: Any,
    ) -> None:
        """`agent`: `async run(client, task[, sandbox]) -> reward` or "module:function";
        or `command`: an agent program's argv. `task_source(rng, **task_kwargs) -> Task`
        (or "module:function") draws tasks when no `tasks` are given. `oracle(episode) ->
        str`: the ideal next model turn given the segment so far, for `parity envs check`.
        `sandbox_backend`: a `parity.sandboxes` backend ("local", "docker") whose sandbox
        the agent gets as `sandbox` (`AgentSandbox`), with `sandbox_limits` (`Limits`
        fields), leased from `sandbox_pool` (a `parity.sandboxes.SandboxPool`, see
        `pool_for`) when one is given. `model`: the model name served. `max_segments`: history rewrites allowed
        per episode, + 1; `kwargs`: TextEnv's (tokenizer, limits, tasks)."""
        if (agent is None) == (command is None):
            raise ValueError("AgentEnv: give exactly one of agent (a function) and command")
        if command is not None and (isinstance(command, str) or not command):
            raise ValueError("command: must be a non-empty list of strings (the agent's argv)")
        if max_segments < 1:
            raise ValueError(f"max_segments must be >= 1, got {max_segments}")
        super().__init__(**kwargs)
        self.agent = resolve(agent, "agent")
        self.command = list(command) if command is not None else None
        self.task_source = resolve(task_source, "task_source")
        self.task_kwargs = dict(task_kwargs or {})
        self._oracle = resolve(oracle, "oracle")
        self.sandbox = AgentSandbox(sandbox_backend, sandbox_limits or {}, sandbox_pool) \
            if sandbox_backend else None
        self.model = model
        self.max_segments = max_segments
        self.session: AgentSession | None = None
        self.rubric = Rubric([])

    @classmethod
    def pool_for(cls, size: int, *, sandbox_backend: str | None = None,
                 sandbox_limits: Mapping[str, Any] | None = None, **_: Any) -> Any:
        """A `parity.sandboxes.SandboxPool` of `size` warm sandboxes like the ones episodes
        made with these kwargs open (None when they open none), for their `sandbox_pool`:
        a rollout worker keeps one and its episodes lease from it."""
        if sandbox_backend is None:
            return None
        from parity.sandboxes import SandboxPool

        return SandboxPool(sandbox_backend, size=size, limits=tool_limits(sandbox_limits or {}))

    def generate_task(self, rng: np.random.Generator) -> Task:
        if self.task_source is None:
            raise ValueError("AgentEnv: no tasks and no task_source to draw them from")
        return self.task_source(rng, **self.task_kwargs)

    def prompt_messages(self, task: Task) -> list[Message]:
        raise TypeError("an AgentEnv's prompts are its agent's requests; play it with run_episode")

    async def respond(self, text: str) -> Response:
        raise TypeError("an AgentEnv answers through its agent; play it with run_episode")

    def oracle_action(self) -> str:
        """The oracle's next model turn for the segment the agent is in."""
        if self.session is None or not self.session.segments or self._oracle is None:
            raise RuntimeError(f"{type(self).__name__}: no oracle (AgentEnv oracle=) or no "
                               "running episode")
        return self._oracle(self.session.segments[-1])

    async def play_episode(self, env: gym.Env, generate: Generate, **kwargs: Any) -> Trajectory:
        """How `run_episode` plays this env (`env`: it, maybe wrapped): `run_agent_episode`."""
        return await run_agent_episode(env, generate, **kwargs)

    async def release(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.close()

    async def play(self, base_url: str, task: Task) -> float:
        """Run the agent on `task` against `base_url`; its reward."""
        if self.command is not None:
            return await self._play_command(base_url, task)
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient

        # plain HTTP to 127.0.0.1: no certificates to load (80 ms of CPU per client)
        client = AsyncOpenAI(base_url=base_url, api_key="parity", max_retries=0,
                             timeout=self.limits.timeout_s,
                             http_client=DefaultAsyncHttpxClient(verify=False))
        try:
            args = {"sandbox": self.sandbox} if "sandbox" in inspect.signature(self.agent).parameters else {}
            return await self.agent(client, dict(task), **args)
        finally:
            await client.close()

    async def _play_command(self, base_url: str, task: Task) -> float:
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "parity",
               "OPENAI_MODEL": self.model, "PARITY_TASK": json.dumps(task)}
        assert self.command is not None
        proc = await asyncio.create_subprocess_exec(
            *self.command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await proc.communicate()
        finally:
            if proc.returncode is None:  # cancelled (timed out): the agent goes too
                proc.kill()
                await proc.wait()
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        if proc.returncode != 0 or not lines:
            why = f"exited with {proc.returncode}" if proc.returncode else "printed no reward"
            said = " ".join(err.decode(errors="replace").split())[-300:]
            raise RuntimeError(f"agent command {self.command[0]} {why}: {said}")
        return float(lines[-1])


async def run_agent_episode(
    env: gym.Env,
    generate: Generate,
    *,
    seed: int | None,
    sampling: SamplingParams | None = None,
    group_id: str = "",
    options: dict[str, Any] | None = None,
) -> Trajectory:
    """Play one episode of the AgentEnv `env` (gymnasium wrappers are passed by: the agent,
    not `step`, drives it) with `generate`; its `Trajectory` (the last segment's, the
    earlier ones in `earlier`), with the episode's reward (0 when it failed). `sampling`: as
    `run_episode`'s."""
    inner = env.unwrapped
    if not isinstance(inner, AgentEnv):
        raise TypeError(f"run_agent_episode needs an AgentEnv, got {type(inner).__name__}")
    sampling = sampling or SamplingParams()
    if not sampling.stop_token_ids:
        sampling = sampling.model_copy(update={"stop_token_ids": tuple(inner.tokenizer.stop_token_ids)})
    gym.Env.reset(inner, seed=seed)
    task = inner.draw_task(options or {})
    server = await endpoint()
    session = inner.session = AgentSession(
        server.new_key(), task, inner.renderer, inner.limits, generate, sampling,
        model=inner.model, max_segments=inner.max_segments, max_action_chars=inner.max_action_chars)
    reward, reason, failure = 0.0, session.limit or "done", None
    try:
        reward = await asyncio.wait_for(inner.play(server.open(session), task), inner.limits.timeout_s)
        if not (isinstance(reward, int | float) and math.isfinite(reward)):
            reason = failure = "reward_error"
        reason = session.limit or reason
    except TimeoutError:
        reason = failure = "timeout"
    except Exception as e:  # the agent's bug ends its episode, not the worker
        log.warning("agent episode failed: %s: %s", type(e).__name__, e)
        reason, failure = f"env_error: {type(e).__name__}: {e}", "env_error"
    finally:
        server.close_session(session)
        await inner.release()
    if not session.segments:  # nothing to train on, and the agent's reward is not the model's
        if failure is None:
            reason = failure = "no_model_call"
        session.segments.append(_empty_segment(inner, task))
    session.end(reason, failure)
    reward = 0.0 if session.failure else float(reward)
    *earlier, last = [ep.trajectory(group_id, reward) for ep in session.segments]
    last.earlier = earlier
    last.metrics.update({"agent/segments": float(len(earlier) + 1),
                         "agent/requests": float(session.requests),
                         "agent/refused": float(session.refused)})
    return last


def _empty_segment(env: AgentEnv, task: Task) -> Episode:
    """The trajectory place-holder of an episode that never called the model: its task alone."""
    ep = Episode(task, [], env.renderer, env.limits, env.max_action_chars)
    ep.observed([])
    return ep
