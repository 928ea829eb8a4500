"""The async episode runner: the contract between environments and the rollout engine.

    traj = await run_episode(env, generate, seed=7, sampling=SamplingParams(max_new_tokens=64))

`generate(prompt_token_ids, sampling) -> Completion` is the engine. The runner resets the
env, then per turn gives the engine the episode's token sequence so far and the env the
engine's completion; the episode (`parity.envs.episode.Episode`) keeps the sequence: the
prompt (mask 0), then per turn the model's tokens exactly as sampled (mask 1, with their
logprobs and policy versions) and the env's observation delta (mask 0). Each model turn is
capped so the sequence never exceeds `env.limits.max_tokens`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import gymnasium as gym

from parity.core.types import Completion, SamplingParams, Trajectory
from parity.envs.core import TextEnv

Generate = Callable[[list[int], SamplingParams], Awaitable[Completion]]


async def run_episode(
    env: gym.Env,
    generate: Generate,
    *,
    seed: int | None,
    sampling: SamplingParams | None = None,
    group_id: str = "",
    options: dict[str, Any] | None = None,
) -> Trajectory:
    """Play one episode of `env` (a TextEnv, or one under gymnasium wrappers: every reset
    and step goes through them, and what they make of the observations and the reward is
    what the trajectory holds) with `generate`.

    `sampling` stop tokens default to the tokenizer's `stop_token_ids`. The result's
    `finish_reason` is the env's ("answer", "max_turns", "max_tokens", "timeout",
    "env_error", ...) or "generate_error: ..." when the engine raised. Its `failure` is the
    env's (`Episode.failure`), or "generate_error" when the engine raised: such an episode
    is not the agent's doing and its reward (0) is not used for training.
    """
    inner = env.unwrapped
    if not isinstance(inner, TextEnv):
        raise TypeError(f"run_episode needs a parity TextEnv, got {type(inner).__name__}")
    play = getattr(inner, "play_episode", None)
    if play is not None:  # an env that drives its own episodes (parity.envs.agent.AgentEnv)
        return await play(env, generate, seed=seed, sampling=sampling, group_id=group_id,
                          options=options)
    sampling = sampling or SamplingParams()
    if not sampling.stop_token_ids:
        sampling = sampling.model_copy(update={"stop_token_ids": tuple(inner.tokenizer.stop_token_ids)})
    if env is inner:  # no wrappers: straight on this loop
        obs, _ = await inner.areset(seed=seed, options=options)
    else:
        obs, _ = await inner.through_wrappers(lambda: env.reset(seed=seed, options=options))
    ep = inner.episode
    assert ep is not None
    ep.observed(obs["token_ids"])
    reward = 0.0
    while True:
        budget = ep.limits.max_tokens - ep.num_tokens
        turn = sampling.model_copy(update={"max_new_tokens": max(1, min(sampling.max_new_tokens, budget))})
        t0 = time.monotonic()
        try:
            completion = await generate(list(ep.tokens), turn)
        except Exception as e:  # the engine's failure ends this episode, not the worker
            ep.end(f"generate_error: {type(e).__name__}: {e}", "generate_error")
            break
        model_s = time.monotonic() - t0
        action = {"token_ids": completion.token_ids}
        if env is inner:
            obs, reward, terminated, truncated, _ = await inner.astep(action)
        else:
            obs, reward, terminated, truncated, _ = await inner.through_wrappers(lambda a=action: env.step(a))
        ep.sampled(completion, model_s)
        ep.observed(obs["token_ids"])
        if terminated or truncated:
            break
    return ep.trajectory(group_id, reward)


def oracle_generate(env: gym.Env, turn: Callable[[TextEnv], str] | None = None) -> Generate:
    """A `generate` that plays `turn(env)` (by default the env's oracle: its ideal turn),
    encoded, plus the end-of-turn token (logprob 0, version 0). For `parity envs check`
    and SFT demonstrations."""
    inner = env.unwrapped
    tok = inner.tokenizer

    async def generate(prompt_token_ids: list[int], sampling: SamplingParams) -> Completion:
        text = turn(inner) if turn else inner.oracle_action()
        ids = [*tok.encode(text), tok.eos_token_id][: sampling.max_new_tokens]
        finish = "stop" if ids and ids[-1] == tok.eos_token_id else "length"
        return Completion(ids, [0.0] * len(ids), [0] * len(ids), finish)

    return generate
