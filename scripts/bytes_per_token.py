"""Bytes per token of trajectories as they cross processes (rollout worker → driver →
learner): one group of the default env's oracle episodes, and the same episodes with their
token fields stretched to 200 and 2000 tokens, pickled as Ray pickles them (protocol 5).

    .venv/bin/python scripts/bytes_per_token.py

"all" counts the whole pickled group (messages, task, timings too); "token fields" counts
only tokens, loss_mask, logprobs and versions, pickled as the Trajectory holds them; "held"
is the memory the receiving process allocates to unpickle the group; "µs" is the CPU time
of one hop's pickling and unpickling of the whole group. All per token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import time
import tracemalloc

from parity.core.types import Trajectory
from parity.envs.registry import make_env
from parity.envs.runner import oracle_generate, run_episode

ENV = "parity/PythonTool-v0"  # the default job's env, with its config's kwargs
KWARGS = {"difficulty": 0, "kinds": ["mul"], "backend": "local"}
GROUP = 8  # rollout.group_size
FIELDS = ("tokens", "loss_mask", "logprobs", "versions")


async def _group() -> list[Trajectory]:
    env = make_env(ENV, **KWARGS)
    try:
        return [await run_episode(env, oracle_generate(env), seed=s, group_id="0")
                for s in range(GROUP)]
    finally:
        env.close()


def _stretched(t: Trajectory, n: int) -> Trajectory:
    """`t` with its token fields repeated to n tokens (their values stay realistic)."""
    def tile(x):
        reps = -(-n // len(x))
        return [v for _ in range(reps) for v in list(x)][:n]

    return dataclasses.replace(t, **{f: tile(getattr(t, f)) for f in FIELDS})


def _per_token(group: list[Trajectory], rounds: int = 50) -> dict[str, float]:
    tokens = sum(len(t.tokens) for t in group)
    data = pickle.dumps(group, protocol=5)
    fields = pickle.dumps([[getattr(t, f) for f in FIELDS] for t in group], protocol=5)
    tracemalloc.start()
    received = pickle.loads(data)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del received
    t0 = time.process_time()
    for _ in range(rounds):
        pickle.loads(pickle.dumps(group, protocol=5))
    hop = (time.process_time() - t0) / rounds
    return {"all": len(data) / tokens, "fields": len(fields) / tokens, "held": held / tokens,
            "us": hop / tokens * 1e6}


def main() -> None:
    group = asyncio.run(_group())
    mean = sum(len(t.tokens) for t in group) / len(group)
    print(f"type of Trajectory.tokens: {type(group[0].tokens).__name__}")
    for label, g in ((f"oracle group (mean {mean:.0f} tokens)", group),
                     ("stretched to 200 tokens", [_stretched(t, 200) for t in group]),
                     ("stretched to 2000 tokens", [_stretched(t, 2000) for t in group])):
        m = _per_token(g)
        print(f"{label}: pickled {m['all']:.1f} B/token all, {m['fields']:.1f} B/token token "
              f"fields; held {m['held']:.1f} B/token; {m['us']:.3f} µs/token per hop")


if __name__ == "__main__":
    main()
