"""The async episode runner: the contract between environments and the rollout engine.

    traj = await run_episode(env, generate, seed=7, sampling=SamplingParams(max_new_tokens=64))

`generate(prompt_token_ids, sampling) -> Completion` is the engine. The runner keeps one flat
token sequence: the prompt (mask 0), then per turn the model's tokens exactly as sampled
(mask 1, with their logprobs and policy versions) and the env's observation delta (mask 0).
Each model turn is capped so the sequence never exceeds `env.limits.max_tokens`.
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
    and step goes through them) with `generate`.

    `sampling` stop tokens default to the tokenizer's `stop_token_ids`. The result's
    `finish_reason` is the env's ("answer", "max_turns", "max_tokens", "timeout",
    "env_error", ...) or "generate_error: ..." when the engine raised. Its `failure` is the
    env's (`Episode.failure`), or "generate_error" when the engine raised: such an episode
    is not the agent's doing and its reward (0) is not used for training. `timings` sums
    model_s, env_s, sandbox_s and reward_s; `info["turn_timings"]` has them per turn.
    """
    inner = env.unwrapped
    if not isinstance(inner, TextEnv):
        raise TypeError(f"run_episode needs a parity TextEnv, got {type(inner).__name__}")
    sampling = sampling or SamplingParams()
    if not sampling.stop_token_ids:
        sampling = sampling.model_copy(update={"stop_token_ids": tuple(inner.tokenizer.stop_token_ids)})
    options = {**(options or {}), "timings": True}
    if env is inner:  # no wrappers: straight on this loop
        obs, reset_info = await inner.areset(seed=seed, options=options)
    else:
        obs, reset_info = await inner.through_wrappers(lambda: env.reset(seed=seed, options=options))
    tokens = list(obs["token_ids"])
    messages = [dict(m) for m in obs["messages"]]
    mask, logprobs, versions = [0] * len(tokens), [0.0] * len(tokens), [-1] * len(tokens)
    model_s: list[float] = []
    env_timings: list[dict[str, float]] = []
    reward, info = 0.0, {}
    finish = ""
    while True:
        budget = inner.limits.max_tokens - len(tokens)
        turn = sampling.model_copy(update={"max_new_tokens": max(1, min(sampling.max_new_tokens, budget))})
        t0 = time.monotonic()
        try:
            completion = await generate(list(tokens), turn)
        except Exception as e:  # the engine's failure ends this episode, not the worker
            finish = f"generate_error: {type(e).__name__}: {e}"
            completion = Completion([], [], [], "abort")
        model_s.append(time.monotonic() - t0)
        tokens += completion.token_ids
        mask += [1] * len(completion.token_ids)
        logprobs += completion.logprobs
        versions += completion.versions
        if finish:
            break
        action = {"token_ids": completion.token_ids, "finish_reason": completion.finish_reason}
        if env is inner:
            obs, reward, terminated, truncated, info = await inner.astep(action)
        else:
            obs, reward, terminated, truncated, info = await inner.through_wrappers(lambda a=action: env.step(a))
        env_timings.append(info["timings"])
        messages += [{"role": "assistant", "content": info["text"]}, *map(dict, obs["messages"])]
        delta = list(obs["token_ids"])
        tokens += delta
        mask += [0] * len(delta)
        logprobs += [0.0] * len(delta)
        versions += [-1] * len(delta)
        if terminated or truncated:
            break
    turn_timings = [{"env_s": t["env_s"], "sandbox_s": t["sandbox_s"], "model_s": m}
                    for t, m in zip(env_timings, model_s, strict=False)]
    timings = {"model_s": sum(model_s)}
    for key in ("env_s", "sandbox_s"):
        timings[key] = sum(t[key] for t in env_timings)
    timings["reward_s"] = env_timings[-1].get("reward_s", 0.0) if env_timings else 0.0
    return Trajectory(
        group_id=group_id,
        tokens=tokens,
        loss_mask=mask,
        logprobs=logprobs,
        versions=versions,
        reward=float(reward),
        reward_components=dict(info.get("reward_components", {})),
        num_turns=len(env_timings),
        finish_reason=finish or info.get("finish_reason", ""),
        failure="generate_error" if finish else inner.episode.failure,
        timings=timings,
        info={
            "task": reset_info.get("task", {}),
            "messages": messages,
            "turn_timings": turn_timings,
            **{k: info[k] for k in ("tool_calls", "parse_errors", "reward_errors", "metrics") if k in info},
        },
    )


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
