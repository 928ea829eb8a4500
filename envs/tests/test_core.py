"""The base env API: gymnasium conformance, bad actions, limits, rubric failures."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import parity.envs  # noqa: F401  (registers the envs)
from parity.envs import Criterion, EpisodeLimits, Response, Rubric, TextEnv, list_envs, make_env
from parity.envs.data import TaskDataError


class EchoEnv(TextEnv):
    """Test env: the model must repeat the task's answer; 'more' continues the episode."""

    def __init__(self, respond_fn=None, criteria=None, **kwargs):
        super().__init__(**kwargs)
        self._respond_fn = respond_fn
        self.rubric = Rubric(criteria or [
            Criterion(lambda ep: float(ep.last_model_text == ep.task["answer"]), 1.0, "exact"),
        ])

    def generate_task(self, rng: np.random.Generator) -> dict:
        n = int(rng.integers(10**6))
        return {"question": f"say {n}", "answer": str(n)}

    def prompt_messages(self, task):
        return [{"role": "user", "content": task["question"]}]

    async def respond(self, text: str) -> Response:
        if self._respond_fn is not None:
            return await self._respond_fn(text)
        if text == "more":
            return Response([{"role": "user", "content": "go on"}], metrics={"parse_errors": 1})
        return Response(done=True, reason="answer")

    def oracle(self) -> str:
        return self.episode.task["answer"]


# parity/Desktop-v0 needs a desktop sandbox; envs/tests/desktop runs check_env on it.
@pytest.mark.parametrize("env_id", ["parity/PythonTool-v0", "parity/Math-v0"])
def test_check_env_passes(env_id: str) -> None:
    env = gym.make(env_id)
    check_env(env.unwrapped)
    env.close()
    env.close()


def test_seeded_reset_is_deterministic_and_prompt_is_rendered() -> None:
    env = EchoEnv()
    obs1, info1 = env.reset(seed=5)
    obs2, info2 = env.reset(seed=5)
    obs3, _ = env.reset(seed=6)
    assert obs1 == obs2 and info1 == info2
    assert obs1 != obs3
    assert env.tokenizer.decode(obs1["token_ids"]) == (
        f"<|im_start|>user\n{info1['task']['question']}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert obs1["messages"] == ({"role": "user", "content": info1["task"]["question"]},)


def test_oracle_episode_and_info() -> None:
    env = EchoEnv()
    env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(env.oracle_action())
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert obs == {"messages": (), "token_ids": ()}
    assert info["finish_reason"] == "answer"
    assert info["reward_components"] == {"exact": 1.0}
    assert set(info) == {"turn", "finish_reason", "num_tokens", "reward_components",
                         "reward_errors", "tool_calls", "parse_errors", "metrics"}
    ep = env.episode
    assert (ep.done, ep.finish_reason, ep.reward_components) == (True, "answer", {"exact": 1.0})
    assert ep.messages[-1] == {"role": "assistant", "content": ep.task["answer"]}
    # the model's tokens as given (mask 1), before the engine's logprobs are attached
    n = len(ep.task["answer"]) + 1
    assert ep.loss_mask[-n:] == [1] * n and ep.versions[-n:] == [-1] * n
    assert [(t.model_s, t.sandbox_s) for t in ep.turn_timings] == [(0.0, 0.0)]
    assert ep.turn_timings[0].env_s >= ep.reward_s > 0
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("again")
    with pytest.raises(RuntimeError, match="needs a running episode"):
        env.oracle_action()


@pytest.mark.parametrize(
    "action",
    [
        {"token_ids": list(np.random.default_rng(0).integers(0, 259, size=300)), "text": None},
        {"token_ids": [], "text": ""},
        {"token_ids": [10**9, -5, 3]},
        {"token_ids": "not ids", "text": 17},
        {"text": "x" * 1_000_000, "token_ids": [3] * 10},
        None,
        42,
        "\udcff\x00 garbage",
    ],
)
def test_garbage_actions_never_raise(action) -> None:
    env = make_env("parity/PythonTool-v0")
    env.reset(seed=0)
    obs, reward, terminated, truncated, _info = env.step(action)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert obs["messages"][0]["content"].startswith("error:")
    inner = env.unwrapped
    assert inner.episode.metrics == {"parse_errors": 1}
    assert len(inner.episode.messages[1]["content"]) <= inner.max_action_chars
    env.close()


def test_text_is_decoded_from_tokens_without_the_stop_token() -> None:
    env = EchoEnv()
    env.reset(seed=2)
    answer = env.episode.task["answer"]
    ids = [*env.tokenizer.encode(answer), env.tokenizer.eos_token_id]
    _, reward, terminated, _, _ = env.step({"token_ids": ids})
    assert env.episode.messages[-1] == {"role": "assistant", "content": answer}
    assert (reward, terminated) == (1.0, True)


def test_max_turns_truncates() -> None:
    env = EchoEnv(limits=EpisodeLimits(max_turns=2))
    env.reset(seed=0)
    obs, _, terminated, truncated, _ = env.step("more")
    assert (terminated, truncated) == (False, False)
    assert env.tokenizer.decode(obs["token_ids"]) == "\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"
    _, reward, terminated, truncated, info = env.step("more")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["finish_reason"] == "max_turns"
    assert info["parse_errors"] == 2


def test_max_tokens_truncates_before_the_observation() -> None:
    env = EchoEnv(limits=EpisodeLimits(max_tokens=40))
    obs, _ = env.reset(seed=0)
    prompt = len(obs["token_ids"])
    _, _, terminated, truncated, info = env.step("more")
    assert prompt + len("more") + 1 + 40 > 40 and (terminated, truncated) == (False, True)
    assert info["finish_reason"] == "max_tokens"
    assert info["num_tokens"] == prompt + len("more") + 1  # the delta was not appended


def test_timeout_truncates() -> None:
    async def slow(text):
        await asyncio.sleep(60)

    env = EchoEnv(respond_fn=slow, limits=EpisodeLimits(timeout_s=0.05))
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step("x")
    assert (terminated, truncated, info["finish_reason"]) == (False, True, "timeout")
    assert env.episode.failure == "timeout"  # a stall, not the agent's doing


def test_env_failure_ends_episode_not_process() -> None:
    async def broken(text):
        raise KeyError("bug")

    env = EchoEnv(respond_fn=broken)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step("x")
    assert (reward, terminated, truncated, info["finish_reason"]) == (0.0, False, True, "env_error")
    assert env.episode.failure == "env_error"


def test_a_failed_turn_ends_the_episode_failed_and_unscored() -> None:
    """`Response.failure`: the env's own resources failed; the episode is truncated, marked
    with the kind, and its rubric is not run (its reward would not be the agent's)."""
    scored = []

    async def lost(text):
        return Response(done=True, reason="sandbox_error: gone", failure="sandbox",
                        metrics={"tool_calls": 1})

    env = EchoEnv(respond_fn=lost, criteria=[Criterion(lambda ep: scored.append(1) or 1.0)])
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step("x")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert (info["finish_reason"], env.episode.failure) == ("sandbox_error: gone", "sandbox")
    assert (scored, info["reward_components"], info["metrics"]) == ([], {}, {"tool_calls": 1})


def test_rubric_weights_and_crashing_reward() -> None:
    def crash(ep):
        raise ZeroDivisionError

    async def half(ep):
        return 0.5

    env = EchoEnv(criteria=[
        Criterion(half, 2.0, "half"),
        Criterion(crash, 1.0, "crash"),
        Criterion(lambda ep: float("nan"), 1.0, "nan"),
        Criterion(lambda ep: 7.0, 0.0, "logged"),
    ])
    env.reset(seed=0)
    _, reward, _, _, info = env.step("anything")
    assert reward == 1.0
    assert info["reward_components"] == {"half": 0.5, "crash": 0.0, "nan": 0.0, "logged": 7.0}
    assert info["reward_errors"] == 2
    assert env.episode.failure == "reward_error"  # a counted criterion broke: R is wrong
    logged_only = EchoEnv(criteria=[Criterion(half, 1.0, "half"), Criterion(crash, 0.0, "crash")])
    logged_only.reset(seed=0)
    _, reward, _, _, info = logged_only.step("anything")
    assert (reward, info["reward_errors"], logged_only.episode.failure) == (0.5, 1, None)
    with pytest.raises(ValueError, match="duplicate reward names"):
        Rubric([Criterion(half), Criterion(half)])


def test_task_rows_are_checked() -> None:
    with pytest.raises(TaskDataError, match="tasks: row 1: missing field 'answer'"):
        EchoEnv(tasks=[{"question": "a", "answer": "1"}, {"question": "b"}])
    env = EchoEnv(tasks=[{"question": "a", "answer": "1"}, {"question": "b", "answer": "2"}])
    _obs, info = env.reset(seed=0, options={"task_index": 1})
    assert info["task"] == {"question": "b", "answer": "2"}
    _, info = env.reset(options={"task": {"question": "c", "answer": "3"}})
    assert info["task"]["question"] == "c"
    with pytest.raises(TaskDataError, match=r"options\['task'\]: row 0: missing field 'question'"):
        env.reset(options={"task": {"answer": "3"}})


def test_async_api_runs_many_episodes_concurrently() -> None:
    async def main():
        envs = [EchoEnv() for _ in range(50)]
        await asyncio.gather(*(e.areset(seed=i) for i, e in enumerate(envs)))
        results = await asyncio.gather(*(e.astep(e.oracle_action()) for e in envs))
        with pytest.raises(RuntimeError, match="await areset"):
            envs[0].reset(seed=0)
        return results

    results = asyncio.run(main())
    assert [r[1] for r in results] == [1.0] * 50


def test_envs_run_without_torch() -> None:
    """Environments need the tokenizer, not the model: importing parity.envs and playing a
    turn of an env loads no torch (a fresh process: this one has it loaded)."""
    code = ("import sys\nfrom parity.envs import make_env\n"
            "env = make_env('parity/Math-v0')\nenv.reset(seed=0)\nenv.step('no idea')\n"
            "env.close()\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_limits_from_a_config_dict() -> None:
    env = make_env("parity/PythonTool-v0", limits={"max_turns": 2, "max_tokens": 1000})
    assert env.unwrapped.limits == EpisodeLimits(max_turns=2, max_tokens=1000)
    with pytest.raises(TypeError, match="unexpected keyword argument 'turns'"):
        make_env("parity/Math-v0", limits={"turns": 2})


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match=r"EpisodeLimits\.max_tokens must be > 0"):
        EpisodeLimits(max_tokens=0)


def test_every_env_is_listed_with_a_description() -> None:
    envs = {e["id"]: e for e in list_envs()}
    assert {"parity/PythonTool-v0", "parity/Math-v0", "parity/Desktop-v0"} <= set(envs)
    assert all(e["description"] and "\n" not in e["description"] for e in envs.values())


def test_unknown_env_id() -> None:
    with pytest.raises(ValueError, match="unknown environment 'parity/Nope-v0'; registered: "):
        make_env("parity/Nope-v0")
