"""`parity bench agent`: what the OpenAI endpoint adds to a model call.

64 agent episodes (by default) run at once on one event loop, as on one rollout worker,
each an `openai.AsyncOpenAI` agent of several turns whose history grows by a tool message
per turn. The engine is a stand-in that waits `engine_ms` and returns `tokens` tokens, so
that what is measured is the endpoint alone: per request, the agent's wall time for
`chat.completions.create` minus the engine call's own (the direct engine call). The
remainder is the HTTP round trip on loopback, the SDK's encoding and parsing, the request's
checks, the chat template's observation delta, and waiting for the loop behind the other
episodes' requests. `server_*`: the part spent in the endpoint itself, from the request's
body read to its answer (`AgentSession.overhead_s`). The episodes run in lockstep (every
engine call takes the same time), so each wave of requests arrives at once: a worst case
for queueing on one event loop.

    uv run parity bench agent [--episodes 64] [--turns 4] [--engine-ms 20] [--json]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import typer

GOAL_P50_MS = 2.0


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _bench(episodes: int, turns: int, engine_ms: float, tokens: int,
                 raw: bool) -> dict[str, Any]:
    from parity.core.types import Completion, SamplingParams
    from parity.envs.agent.env import AgentEnv, run_agent_episode

    added: list[float] = []

    def episode() -> tuple[Any, Any]:
        engine_s: list[float] = []

        async def generate(prompt: list[int], sampling: SamplingParams) -> Completion:
            t0 = time.perf_counter()
            await asyncio.sleep(engine_ms / 1000)
            ids = [*env.tokenizer.encode("x" * (tokens - 1)), env.tokenizer.eos_token_id]
            engine_s.append(time.perf_counter() - t0)
            return Completion(ids, [-0.5] * len(ids), [0] * len(ids), "stop")

        async def agent(client: Any, task: dict) -> float:
            messages: list[Any] = [{"role": "user", "content": task["question"]}]
            http = client._client if raw else None  # the SDK's own httpx client
            for turn in range(turns):
                t0 = time.perf_counter()
                if raw:
                    r = await http.post(f"{client.base_url}chat/completions",
                                        json={"model": "policy", "messages": messages})
                    message = r.json()["choices"][0]["message"]
                else:
                    r = await client.chat.completions.create(model="policy", messages=messages)
                    message = r.choices[0].message.model_dump(exclude_none=True)
                added.append(time.perf_counter() - t0 - engine_s[turn])
                messages += [message, {"role": "tool", "content": f"out {turn}"}]
            return 1.0

        env = AgentEnv(agent=agent, tasks=[{"question": "Q: 6*7=?", "answer": "42"}],
                       limits={"max_turns": turns, "max_tokens": 65536})
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
    return {"episodes": episodes, "turns": turns, "engine_ms": engine_ms, "tokens": tokens,
            "requests": len(ms), "added_p50_ms": statistics.median(ms),
            "added_p99_ms": _quantile(ms, 0.99), "server_p50_ms": statistics.median(server),
            "server_p99_ms": _quantile(server, 0.99), "requests_per_s": len(ms) / wall,
            "goal_p50_ms": GOAL_P50_MS, "goal_met": statistics.median(ms) <= GOAL_P50_MS}


def run_benchmark(episodes: int = 64, turns: int = 4, engine_ms: float = 20.0,
                  tokens: int = 32, raw: bool = False) -> dict[str, Any]:
    """The report (see the module docstring): added_p50_ms, added_p99_ms, requests_per_s.
    `raw`: the agents post JSON with the SDK's httpx client instead of calling the SDK."""
    import openai  # noqa: F401  (imported before the clock starts: a second, once)

    return asyncio.run(_bench(episodes, turns, engine_ms, tokens, raw))


def bench_agent(
    json_: bool = typer.Option(False, "--json", help="print one JSON object"),
    episodes: int = typer.Option(64, min=1, help="agent episodes at once"),
    turns: int = typer.Option(4, min=1, help="model calls per episode"),
    engine_ms: float = typer.Option(20.0, min=0.0, help="the stand-in engine's time per call"),
) -> None:
    """What the OpenAI endpoint adds to a model call (p50/p99), agents using the SDK and
    agents posting JSON, with many agent episodes on one worker."""
    report = {kind: run_benchmark(episodes, turns, engine_ms, raw=kind == "json")
              for kind in ("sdk", "json")}
    if json_:
        typer.echo(json.dumps(report, indent=2))
        return
    for kind, row in report.items():
        typer.echo(f"{kind}: {episodes} episodes x {turns} calls, engine {engine_ms:g} ms: added "
                   f"p50 {row['added_p50_ms']:.2f} ms p99 {row['added_p99_ms']:.2f} ms (in the "
                   f"endpoint p50 {row['server_p50_ms']:.2f} ms p99 {row['server_p99_ms']:.2f} ms), "
                   f"{row['requests_per_s']:.0f} requests/s (goal p50 <= {GOAL_P50_MS:g} ms: "
                   f"{'met' if row['goal_met'] else 'not met'})")
