"""AgentEnv: what ends an agent episode as a failure, and agents in other languages."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import openai
import pytest
from agent_engine import TASK, Engine, play

from parity.envs import EpisodeLimits
from parity.envs.agent import AgentEnv, run_agent_episode
from parity.envs.runner import run_episode


@pytest.mark.parametrize(("agent_body", "reason", "failure"), [
    ("raise RuntimeError('boom')", "env_error: RuntimeError: boom", "env_error"),
    ("await asyncio.sleep(60)", "timeout", "timeout"),
    ("return 1.0", "no_model_call", "no_model_call"),
    ("await call(client); return float('nan')", "reward_error", "reward_error"),
])
def test_agent_failures_are_env_failures(agent_body, reason, failure) -> None:
    async def call(client):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}])

    scope = {"asyncio": asyncio, "call": call}
    exec(f"async def agent(client, task):\n    {agent_body}", scope)
    _, _, trajs = play(scope["agent"], ["a"], limits=EpisodeLimits(timeout_s=0.5))
    traj = trajs[-1]
    assert (traj.finish_reason, traj.failure, traj.reward) == (reason, failure, 0.0)


def test_engine_failure_is_a_500_and_generate_error() -> None:
    statuses = []

    async def agent(client, task):
        try:
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}])
        except openai.InternalServerError as e:
            statuses.append(e.status_code)
        try:
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}])
        except openai.APIStatusError as e:
            statuses.append(e.status_code)
        return 1.0

    env = AgentEnv(agent=agent, tasks=[TASK])

    async def broken(prompt, sampling):
        raise OSError("engine gone")

    traj = asyncio.run(run_agent_episode(env, broken, seed=0))
    assert statuses == [500, 410]
    assert (traj.failure, traj.finish_reason) == ("generate_error", "generate_error: OSError: engine gone")


def test_command_line_agent_and_run_episode_dispatch(tmp_path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent("""
        import json, os
        from openai import OpenAI
        task = json.loads(os.environ["PARITY_TASK"])
        client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
        r = client.chat.completions.create(model=os.environ["OPENAI_MODEL"],
                                           messages=[{"role": "user", "content": task["question"]}])
        print("the model said", r.choices[0].message.content)
        print(float(r.choices[0].message.content == task["answer"]))
    """))
    env = AgentEnv(command=[sys.executable, str(script)], tasks=[TASK])
    engine = Engine(env.tokenizer, ["42"])
    traj = asyncio.run(run_episode(env, engine, seed=0))  # the runner hands it to the agent
    assert (traj.reward, traj.failure, traj.num_turns) == (1.0, None, 1)
    failing = AgentEnv(command=[sys.executable, "-c", "import sys; sys.exit('no luck')"], tasks=[TASK])
    traj = asyncio.run(run_episode(failing, Engine(env.tokenizer, ["42"]), seed=0))
    assert traj.failure == "env_error"
    assert traj.finish_reason.endswith("exited with 1: no luck")


def test_a_timed_out_agent_takes_its_engine_call_with_it() -> None:
    state = {}

    async def agent(client, task):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}])
        return 1.0

    async def stuck(prompt, sampling):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise

    async def main():
        env = AgentEnv(agent=agent, tasks=[TASK], limits=EpisodeLimits(timeout_s=0.5))
        traj = await run_agent_episode(env, stuck, seed=0)
        for _ in range(3):
            await asyncio.sleep(0)
        return traj

    traj = asyncio.run(main())
    assert (traj.failure, traj.finish_reason) == ("timeout", "timeout")
    assert state == {"cancelled": True}
