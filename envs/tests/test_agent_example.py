"""The agent in docs/agents.md and examples/agent_python_tool.py: checked like any env, and
token for token the built-in `parity/PythonTool-v0`; `parity bench agent`'s report."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from parity.core.types import Completion
from parity.envs.cli import app
from parity.envs.python_tool import PythonToolEnv
from parity.envs.registry import make_env
from parity.envs.runner import run_episode

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_ID = "examples.agent_python_tool:parity/AgentPythonTool-v0"


def _check(env_id: str) -> dict:
    res = CliRunner().invoke(app, ["check", env_id, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_the_docs_agent_is_short_and_passes_envs_check(tmp_path, monkeypatch) -> None:
    block = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "agents.md").read_text(), re.S)[0]
    assert len(block.splitlines()) < 40
    (tmp_path / "my_agents").mkdir()
    (tmp_path / "my_agents" / "docs_agent.py").write_text(block)
    monkeypatch.chdir(tmp_path)
    report = _check("my_agents.docs_agent:parity/AgentPythonTool-v0")
    assert (report["ok"], report["oracle_reward"], report["oracle_turns"]) == (True, 1.0, 2)


def test_the_example_passes_envs_check(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    report = _check(EXAMPLE_ID)
    assert report["check_env"] == "ok (an agent env: its oracle episode is the check)"
    assert (report["ok"], report["oracle_failure"]) == (True, None)


def _engine(tok, wrong: bool):
    """A deterministic policy: run the question's expression, then answer what it printed
    (plus one when `wrong`); logprob and version from the prompt's length."""

    async def generate(prompt, sampling):
        text = tok.decode(prompt)
        if "<|im_start|>tool" not in text:
            reply = "<py>print(" + re.search(r"Q: (.*?)=\?", text).group(1) + ")</py>"
        else:
            out = int(text.rsplit("<|im_start|>tool\n", 1)[1].split("\n")[0])
            reply = f"<ans>{out + wrong}</ans>"
        ids = [*tok.encode(reply), tok.eos_token_id]
        return Completion(ids, [-len(prompt) / 100] * len(ids), [len(prompt)] * len(ids), "stop")

    return generate


@pytest.mark.parametrize("wrong", [False, True])
def test_the_example_plays_the_builtin_env_token_for_token(monkeypatch, wrong) -> None:
    monkeypatch.chdir(ROOT)
    kwargs = {"difficulty": 0, "kinds": ["mul"]}
    agent_env = make_env(EXAMPLE_ID, task_kwargs=kwargs)
    builtin = PythonToolEnv(**kwargs)
    gen = _engine(builtin.tokenizer, wrong)

    async def both(seed):
        return (await run_episode(agent_env, gen, seed=seed),
                await run_episode(builtin, gen, seed=seed))

    for seed in range(3):
        agent, env = asyncio.run(both(seed))
        assert agent.task["question"] == env.task["question"]
        fields = ("tokens", "loss_mask", "logprobs", "versions")
        assert [getattr(agent, f).tolist() for f in fields] == [getattr(env, f).tolist() for f in fields]
        assert (agent.reward, agent.num_turns, agent.failure) == (env.reward, env.num_turns, None)
        assert agent.reward == float(not wrong)
    agent_env.close()
    builtin.close()


def test_bench_agent_reports_every_request() -> None:
    from parity.envs.agent.bench import run_benchmark, stand_in

    for raw in (False, True):
        report = run_benchmark(episodes=3, turns=2, raw=raw, make_generate=stand_in(0.0, 32))
        assert (report["episodes"], report["requests"]) == (3, 6)
        assert {"added_p50_ms", "added_p99_ms", "server_p50_ms", "server_p99_ms",
                "requests_per_s", "goal_met"} <= report.keys()


def test_play_answers_an_agents_model_calls_by_hand(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    res = CliRunner().invoke(app, ["play", EXAMPLE_ID, "--oracle"],
                             input="<py>print(865*6)</py>\n<ans>5190</ans>\n")
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        "user> Q: 865*6=?",
        "[oracle] <py>print(865*6)</py>",
        "assistant> tool> 5190",
        "",
        "[oracle] <ans>5190</ans>",
        "assistant> episode over: reward=1.0 finish_reason=done segments=1",
        "expected answer: 5190",
    ]
    res = CliRunner().invoke(app, ["play", EXAMPLE_ID], input="")
    assert (res.exit_code, res.output.splitlines()[-1]) == (0, "(end of input)")
