"""A deterministic engine and a player for the AgentEnv tests."""

from __future__ import annotations

import asyncio

from parity.core.types import Completion
from parity.envs.agent import AgentEnv, run_agent_episode

TASK = {"question": "Q: 6*7=?", "answer": "42"}


class Engine:
    """A `generate` whose turn is a function of the prompt: `reply(prompt_text)` (by default
    the scripted turns in order), logprob -k/8 and version k for the k-th call."""

    def __init__(self, tok, turns=(), reply=None):
        self.tok, self.turns, self.reply = tok, list(turns), reply
        self.prompts: list[list[int]] = []
        self.sampling = []

    async def __call__(self, prompt, sampling):
        self.prompts.append(list(prompt))
        self.sampling.append(sampling)
        k = len(self.prompts)
        text = self.reply(self.tok.decode(prompt)) if self.reply else self.turns[k - 1]
        ids = [*self.tok.encode(text), self.tok.eos_token_id][: sampling.max_new_tokens]
        finish = "stop" if ids[-1] == self.tok.eos_token_id else "length"
        return Completion(ids, [-k / 8] * len(ids), [k] * len(ids), finish)


def play(agent, turns=(), reply=None, **kwargs):
    env = AgentEnv(agent=agent, tasks=[TASK], **kwargs)
    engine = Engine(env.tokenizer, turns, reply)
    traj = asyncio.run(run_agent_episode(env, engine, seed=0, group_id="g"))
    return env.tokenizer, engine, traj.segments
