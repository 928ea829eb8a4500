"""`parity bench agent`: what the OpenAI endpoint adds to a model call.

64 agent episodes (by default) run at once on one event loop, as on one rollout worker,
each an `openai.AsyncOpenAI` agent of several turns whose history grows by a tool message
per turn. Per request it measures the agent's wall time for `chat.completions.create` minus
the engine call's own (the direct engine call): the HTTP round trip on loopback, the SDK's
encoding and parsing, the request's checks, the chat template's observation delta, and
waiting for the loop behind the other episodes' requests (and, with a real engine, behind
its steps, which run on the same loop). `server_*`: the part spent in the endpoint itself,
from the request's body read to its answer (`AgentSession.overhead_s`).

The engine is a stand-in that waits `engine_ms` and returns `tokens` tokens, so that what is
measured is the endpoint alone; its episodes run in lockstep (every engine call takes the
same time), so each wave of requests arrives at once: a worst case for queueing on one
event loop. Or a real one (`make_generate`: `parity bench agent --engine parity` runs the
embedded model on parity's engine), whose calls batch as a rollout worker's do.

    uv run parity bench agent [--engine stand-in|parity] [--episodes 64] [--turns 4] [--json]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI loads this module: its imports stay light
    from parity.core.types import Completion, SamplingParams
    from parity.envs.runner import Generate

GOAL_P50_MS = 2.0


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def stand_in(engine_ms: float, tokens: int) -> Callable[[Any], Generate]:
    """A `make_generate` whose engine waits `engine_ms` and returns `tokens` tokens."""

    def make(tok: Any) -> Generate:
        from parity.core.types import Completion

        async def generate(prompt: list[int], sampling: SamplingParams) -> Completion:
            await asyncio.sleep(engine_ms / 1000)
            ids = [*tok.encode("x" * (tokens - 1)), tok.eos_token_id]
            return Completion(ids, [-0.5] * len(ids), [0] * len(ids), "stop")

        return generate

    return make


async def _bench(episodes: int, turns: int, make_generate: Callable[[Any], Generate],
                 tokens: int, raw: bool, tokenizer: Any) -> dict[str, Any]:
    from parity.envs.agent.env import AgentEnv, run_agent_episode

    added: list[float] = []
    engine_all: list[float] = []

    def episode() -> tuple[Any, Any]:
        engine_s: list[float] = []
        engine: Generate | None = None

        async def generate(prompt: list[int], sampling: SamplingParams) -> Completion:
            t0 = time.perf_counter()
            assert engine is not None
            completion = await engine(prompt, sampling)
            engine_s.append(time.perf_counter() - t0)
            return completion

        async def agent(client: Any, task: dict) -> float:
            messages: list[Any] = [{"role": "user", "content": task["question"]}]
            http = client._client if raw else None  # the SDK's own httpx client
            for turn in range(turns):
                t0 = time.perf_counter()
                if raw:
                    r = await http.post(f"{client.base_url}chat/completions", json={
                        "model": "policy", "messages": messages, "max_tokens": tokens})
                    message = r.json()["choices"][0]["message"]
                else:
                    r = await client.chat.completions.create(model="policy", messages=messages,
                                                             max_tokens=tokens)
                    message = r.choices[0].message.model_dump(exclude_none=True)
                added.append(time.perf_counter() - t0 - engine_s[turn])
                engine_all.append(engine_s[turn])
                messages += [message, {"role": "tool", "content": f"out {turn}"}]
            return 1.0

        env = AgentEnv(agent=agent, tasks=[{"question": "Q: 6*7=?", "answer": "42"}],
                       limits={"max_turns": turns, "max_tokens": 65536},
                       **({"tokenizer": tokenizer} if tokenizer is not None else {}))
        engine = make_generate(env.tokenizer)
        return env, generate

    plays = [episode() for _ in range(episodes)]
    t0 = time.perf_counter()
    trajs = await asyncio.gather(*(run_agent_episode(env, gen, seed=0) for env, gen in plays))
    wall = time.perf_counter() - t0
    failed = [t.finish_reason for t in trajs if t.failure]
    if failed:
        raise RuntimeError(f"{len(failed)} of {episodes} bench episodes failed: {failed[0]}")
    ms = [x * 1000 for x in added]
    server = [x * 1000 for env, _ in plays for x in env.session.overhead_s]
    return {"episodes": episodes, "turns": turns, "tokens": tokens,
            "engine_p50_ms": 1000 * statistics.median(engine_all),
            "requests": len(ms), "added_p50_ms": statistics.median(ms),
            "added_p99_ms": _quantile(ms, 0.99), "server_p50_ms": statistics.median(server),
            "server_p99_ms": _quantile(server, 0.99), "requests_per_s": len(ms) / wall,
            "goal_p50_ms": GOAL_P50_MS, "goal_met": statistics.median(ms) <= GOAL_P50_MS}


def run_benchmark(episodes: int = 64, turns: int = 4, tokens: int = 32, raw: bool = False,
                  make_generate: Callable[[Any], Generate] | None = None,
                  tokenizer: Any = None) -> dict[str, Any]:
    """The report (see the module docstring): added_p50_ms, added_p99_ms, requests_per_s.
    `raw`: the agents post JSON with the SDK's httpx client instead of calling the SDK.
    `make_generate(tokenizer)`: the engine (default: `stand_in(20, tokens)`); `tokenizer`:
    the episodes' (a model directory; default the env's own)."""
    import openai  # noqa: F401  (imported before the clock starts: a second, once)

    return asyncio.run(_bench(episodes, turns, make_generate or stand_in(20.0, tokens), tokens,
                              raw, tokenizer))


def report_lines(report: dict[str, dict[str, Any]], engine: str) -> list[str]:
    """`parity bench agent`'s lines: one per way of calling (the SDK, posting JSON)."""
    return [f"{kind}: {row['episodes']} episodes x {row['turns']} calls, engine {engine} (p50 "
            f"{row['engine_p50_ms']:.1f} ms a call): added p50 {row['added_p50_ms']:.2f} ms p99 "
            f"{row['added_p99_ms']:.2f} ms (in the endpoint p50 {row['server_p50_ms']:.2f} ms "
            f"p99 {row['server_p99_ms']:.2f} ms), {row['requests_per_s']:.0f} requests/s (goal "
            f"p50 <= {GOAL_P50_MS:g} ms: {'met' if row['goal_met'] else 'not met'})"
            for kind, row in report.items()]
