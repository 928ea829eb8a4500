"""Where one engine step's time goes: a `parity bench engine` case, split by phase.

    uv run python scripts/profile_engine_step.py "tiny batch"            # 64 x 128 new
    uv run python scripts/profile_engine_step.py qwen2-0.5b --new-tokens 32 --repeats 3
    uv run python scripts/profile_engine_step.py "tiny batch" --threads 1   # as a rollout actor
    uv run python scripts/profile_engine_step.py multi-turn --repeats 1     # prefill vs cache
    uv run python scripts/profile_engine_step.py qwen2-0.5b --dtype bfloat16

A multi-turn case (`parity bench engine --case multi-turn`) runs its episodes turn by turn
(each turn a prefill of the new observation against the cached prefix, then decode) and is
split the same way, per turn instead of per step.

Runs the case's requests under aligned and standard kernels in turn (`--repeats` rounds,
interleaved, after a warm-up; the fastest round per mode is shown, as the bench does) and
times, with wall clocks around the engine's own functions: the linears (every aligned or
standard linear call, by weight shape, "prefill" when a call has over 64 rows), the attention
kernel, the
sampler (`next_tokens` without its lm_head linear), the scheduler and the bookkeeping; what
is left of a step is the rest of the forward (norms, RoPE, SiLU, residual adds, KV writes,
the layout) and Python. A diagnosis aid: the clocks cost a few microseconds per call.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from typing import Any

import torch

from parity.core.memory import ask_huge_pages, keep_freed_memory
from parity.engine import engine as engine_module
from parity.engine import model_runner
from parity.engine.bench import CASES, ON_REQUEST, _models, _params, _requests
from parity.engine.engine import Engine
from parity.engine.multi_turn import MultiTurnCase, observations, run_episodes
from parity.engine.scheduler import Scheduler
from parity.model import blas, devices, kernels

Clocks = collections.defaultdict[str, float]


def _timed(clocks: Clocks, key: Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clocks[key(*args, **kwargs)] += time.perf_counter() - start
    return run


def _linear_key(x: torch.Tensor, *rest: Any) -> str:
    """"linear decode 256->1024 (3 weights)": rows over 64 count as prefill."""
    ws = [rest[0]] if isinstance(rest[0], torch.Tensor) else [w for w, _ in rest[0]]
    rows = x.numel() // x.shape[-1]
    stacked = f" ({len(ws)} weights)" if len(ws) > 1 else ""
    return (f"linear {'prefill' if rows > 64 else 'decode'} {ws[0].shape[1]}->"
            f"{sum(w.shape[0] for w in ws)}{stacked}")


def instrument(clocks: Clocks) -> None:
    """Wrap the engine's phases with clocks that add into `clocks` (this process, for good)."""
    for k in (devices.ALIGNED, kernels.STANDARD):
        object.__setattr__(k, "linear", _timed(clocks, _linear_key, k.linear))
        object.__setattr__(k, "linears", _timed(clocks, _linear_key, k.linears))
        object.__setattr__(k, "attention", _timed(clocks, lambda *a: "attention", k.attention))
    model_runner.next_tokens = _timed(clocks, lambda *a: "sampling (with lm_head)", model_runner.next_tokens)
    Scheduler.schedule = _timed(clocks, lambda *a: "scheduling", Scheduler.schedule)
    engine_module.postprocess = _timed(clocks, lambda *a: "bookkeeping", engine_module.postprocess)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", help="a `parity bench engine` case, by part of its name")
    ap.add_argument("--new-tokens", type=int, default=0, help="instead of the case's own")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the model held in this dtype, as the bench's two arms")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    blas.configure()
    keep_freed_memory()
    ask_huge_pages()  # as the `parity` command: before the first tensor
    case = next(c for c in (*CASES, *ON_REQUEST) if args.case in c.name)
    model = _models(case.shape, case.tie_word_embeddings)[args.dtype]
    if isinstance(case, MultiTurnCase):
        obs = observations(case, model.config.vocab_size, seed=0)
        params = _params(case.episodes, args.new_tokens or case.new_tokens)
        run = lambda eng: run_episodes(eng, obs, params)  # noqa: E731
        unit, units, tokens = "turn", lambda eng: case.turns, case.episodes * case.turns * params[0].max_new_tokens
        what = f"{case.episodes} episodes x {case.turns} turns, {params[0].max_new_tokens} new tokens a turn"
    else:
        prompts, params = _requests(case, model.config.vocab_size)
        if args.new_tokens:
            params = [p.model_copy(update={"max_new_tokens": args.new_tokens}) for p in params]
        run = lambda eng: eng.generate(prompts, params)  # noqa: E731
        unit, units, tokens = "step", lambda eng: eng.num_steps, len(prompts) * params[0].max_new_tokens
        what = f"{len(prompts)} sequences, {params[0].max_new_tokens} new tokens each"
    clocks: Clocks = collections.defaultdict(float)
    instrument(clocks)
    best: dict[str, tuple[float, int, dict[str, float]]] = {}
    for r in range(args.repeats + 1):  # round 0 warms up
        for mode in ("aligned", "standard"):
            model.set_kernels(mode)
            eng = Engine(model, case.engine_config())
            clocks.clear()
            start = time.perf_counter()
            run(eng)
            total = time.perf_counter() - start
            if r and (mode not in best or total < best[mode][0]):
                best[mode] = total, units(eng), dict(clocks)
    model.set_kernels("aligned")
    print(f"{case.name} ({args.dtype}): {what}; ms per {unit} (fastest of {args.repeats} rounds)")
    for mode, (total, steps, phases) in best.items():
        sampled = phases.get("sampling (with lm_head)", 0.0)
        head = [k for k in phases if k.startswith("linear") and k.endswith(f"->{model.config.vocab_size}")]
        phases["sampling (with lm_head)"] = sampled - sum(phases[k] for k in head)
        phases = {k.replace("sampling (with lm_head)", "sampling"): v for k, v in phases.items()}
        phases["rest of the forward, Python"] = total - sum(phases.values())
        print(f"  {mode}: {1e3 * total / steps:.2f} ms per {unit}, {steps} {unit}s, "
              f"{tokens / total:.1f} tokens/s")
        for k, v in sorted(phases.items(), key=lambda kv: -kv[1]):
            print(f"    {k:36s} {1e3 * v / steps:8.3f}  ({v / total:5.1%})")


if __name__ == "__main__":
    main()
