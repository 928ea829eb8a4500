"""run_episode: the token-level Trajectory the trainer consumes."""

from __future__ import annotations

import asyncio

import pytest

from parity.core.types import Completion, SamplingParams
from parity.envs import EpisodeLimits, make_env
from parity.envs.python_tool import PythonToolEnv
from parity.envs.runner import oracle_generate, run_episode

MUL = {"question": "Q: 5831*47=?", "answer": "274057", "code": "5831*47"}


class Scripted:
    """A generate() that plays fixed turns and records what it was asked."""

    def __init__(self, tok, turns, cut_last=False):
        self.tok, self.turns, self.cut_last = tok, list(turns), cut_last
        self.calls: list[tuple[list[int], SamplingParams]] = []

    async def __call__(self, prompt, sampling):
        self.calls.append((prompt, sampling))
        text = self.turns[len(self.calls) - 1]
        cut = self.cut_last and len(self.calls) == 1
        ids = self.tok.encode(text) + ([] if cut else [self.tok.eos_token_id])
        n = len(self.calls)
        return Completion(ids, [-0.5 * n] * len(ids), [n] * len(ids), "length" if cut else "stop")


def test_trajectory_is_prompt_model_and_observation_tokens() -> None:
    env = PythonToolEnv()
    tok = env.tokenizer
    gen = Scripted(tok, ["<py>print(5831*47)</py>", "<ans>274057</ans>"])
    traj = asyncio.run(run_episode(env, gen, seed=0, group_id="g1", options={"task": MUL}))
    env.close()
    prompt = tok.encode("<|im_start|>user\nQ: 5831*47=?<|im_end|>\n<|im_start|>assistant\n")
    turn1 = tok.encode("<py>print(5831*47)</py><|im_end|>")
    delta = tok.encode("\n<|im_start|>tool\n274057\n<|im_end|>\n<|im_start|>assistant\n")
    turn2 = tok.encode("<ans>274057</ans><|im_end|>")
    assert traj.tokens.tolist() == prompt + turn1 + delta + turn2
    assert traj.loss_mask.tolist() == [0] * len(prompt) + [1] * len(turn1) + [0] * len(delta) + [1] * len(turn2)
    assert traj.logprobs.tolist() == [0.0] * len(prompt) + [-0.5] * len(turn1) + [0.0] * len(delta) + [-1.0] * len(turn2)
    assert traj.versions.tolist() == [-1] * len(prompt) + [1] * len(turn1) + [-1] * len(delta) + [2] * len(turn2)
    assert (traj.group_id, traj.reward, traj.num_turns, traj.finish_reason) == ("g1", 1.0, 2, "answer")
    assert traj.failure is None
    assert traj.reward_components == {"correct": 1.0, "used_tool": 1.0}
    assert len(traj.turn_timings) == 2 and all(t.model_s > 0 and t.env_s > 0 for t in traj.turn_timings)
    assert traj.turn_timings[0].sandbox_s > 0 and traj.reward_s > 0
    assert traj.task == MUL and traj.metrics == {"tool_calls": 1}
    # the engine was given exactly the sequence so far, and the tokenizer's stop tokens
    assert gen.calls[1][0] == prompt + turn1 + delta
    assert gen.calls[0][1].stop_token_ids == tuple(tok.stop_token_ids)
    # the sequence is the chat template's rendering of the whole chat
    assert traj.tokens.tolist() + tok.encode("\n") == tok.apply_chat_template(traj.messages)


def test_gymnasium_wrappers_see_every_reset_and_step() -> None:
    """A user's wrappers over a made env: one that appends a token to every observation and
    one that rescales the reward both show in the Trajectory and in what the engine saw."""
    from gymnasium.wrappers import TransformObservation, TransformReward

    env = make_env("parity/PythonTool-v0")
    tok = env.unwrapped.tokenizer
    mark = tok.encode("!")[0]
    env = TransformObservation(env, lambda o: {**o, "token_ids": (*o["token_ids"], mark)},
                               env.observation_space)
    env = TransformReward(env, lambda r: 10.0 * r - 1.0)
    gen = Scripted(tok, ["<py>print(5831*47)</py>", "<ans>274057</ans>"])
    traj = asyncio.run(run_episode(env, gen, seed=0, options={"task": MUL}))
    env.close()
    prompt = tok.encode("<|im_start|>user\nQ: 5831*47=?<|im_end|>\n<|im_start|>assistant\n")
    turn1 = tok.encode("<py>print(5831*47)</py><|im_end|>")
    delta = tok.encode("\n<|im_start|>tool\n274057\n<|im_end|>\n<|im_start|>assistant\n")
    turn2 = tok.encode("<ans>274057</ans><|im_end|>")
    assert traj.tokens.tolist() == [*prompt, mark, *turn1, *delta, mark, *turn2, mark]
    assert gen.calls[1][0] == [*prompt, mark, *turn1, *delta, mark]
    assert (traj.reward, traj.num_turns, traj.finish_reason) == (9.0, 2, "answer")
    assert traj.loss_mask.tolist() == [0] * (len(prompt) + 1) + [1] * len(turn1) + [0] * (len(delta) + 1) + \
        [1] * len(turn2) + [0]
    assert traj.versions[len(prompt) + 1] == 1 and len(traj.turn_timings) == 2


def test_turn_cut_by_length_gets_the_end_of_turn_from_the_env() -> None:
    env = PythonToolEnv()
    tok = env.tokenizer
    gen = Scripted(tok, ["<py>print(1)</py>", "<ans>274057</ans>"], cut_last=True)
    traj = asyncio.run(run_episode(env, gen, seed=0, options={"task": MUL}))
    env.close()
    text = tok.decode(traj.tokens)
    assert "<py>print(1)</py><|im_end|>\n<|im_start|>tool\n1\n<|im_end|>" in text
    # the env's <|im_end|> is masked out: the model never produced it
    i = len(tok.encode(text.split("</py>")[0] + "</py>"))
    assert traj.loss_mask[i - 1] == 1 and traj.loss_mask[i] == 0


def test_token_budget_caps_each_turn() -> None:
    env = PythonToolEnv(limits=EpisodeLimits(max_turns=4, max_tokens=120))
    gen = Scripted(env.tokenizer, ["<py>print(5831*47)</py>", "<ans>274057</ans>"])
    traj = asyncio.run(run_episode(env, gen, seed=0, sampling=SamplingParams(max_new_tokens=500),
                                   options={"task": MUL}))
    env.close()
    assert [c[1].max_new_tokens for c in gen.calls] == [120 - len(c[0]) for c in gen.calls]
    assert len(traj.tokens) <= 120


def test_engine_failure_ends_the_episode_only() -> None:
    env = PythonToolEnv()

    async def broken(prompt, sampling):
        raise ConnectionError("engine gone")

    traj = asyncio.run(run_episode(env, broken, seed=0))
    assert traj.finish_reason == "generate_error: ConnectionError: engine gone"
    assert (traj.failure, traj.reward, sum(traj.loss_mask)) == ("generate_error", 0.0, 0)
    # the env is still usable
    assert asyncio.run(run_episode(env, oracle_generate(env), seed=1)).reward == 1.0
    env.close()


def test_oracle_generate_plays_the_turn_it_is_given() -> None:
    env = PythonToolEnv()
    answer_at_once = oracle_generate(env, lambda e: f"<ans>{e.episode.task['answer']}</ans>")
    traj = asyncio.run(run_episode(env, answer_at_once, seed=0, options={"task": MUL}))
    env.close()
    assert traj.messages[1] == {"role": "assistant", "content": "<ans>274057</ans>"}
    assert (traj.num_turns, traj.reward_components) == (1, {"correct": 1.0, "used_tool": 0.0})


def test_many_concurrent_episodes() -> None:
    async def main():
        envs = [PythonToolEnv() for _ in range(12)]
        try:
            return await asyncio.gather(*(run_episode(e, oracle_generate(e), seed=i) for i, e in enumerate(envs)))
        finally:
            for e in envs:
                e.close()

    trajs = asyncio.run(main())
    assert [t.reward for t in trajs] == [1.0] * 12
    assert len({t.task["question"] for t in trajs}) == 12


def test_needs_a_text_env() -> None:
    import gymnasium as gym

    with pytest.raises(TypeError, match="run_episode needs a parity TextEnv, got CartPoleEnv"):
        asyncio.run(run_episode(gym.make("CartPole-v1"), oracle_generate, seed=0))
