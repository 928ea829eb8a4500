"""`parity bench engine`: generation tokens/s, aligned vs standard kernels, side by side.

tokens/s = generated tokens / wall time of `Engine.generate` (prefill included), except in
the long-context case, whose 8192-token prompts are prefilled once before the clock starts
(the timed run finds them in the prefix cache): it measures decode against a long KV.

Each case builds one random-weight model and a bf16 copy of it, then runs the same requests
under each kernel mode and dtype (and on vLLM, whose servers start first) in turn, round after
round, after a warm-up. A figure is the median of its rounds, shown with each round; a ratio is
taken round by round, each pair measured in the same round, and one whose rounds disagree by
more than UNSTEADY (15%) is reported as None: on a shared VM a single round is noise (one case
once gave 287 and 4,951 tokens/s in one process). Each case also reports the
memory-bandwidth bound batch x bandwidth / weight bytes (`parity.engine.bandwidth`), from a
copy benchmark run in the same process, and the fraction of it each mode reached.

The multi-turn case (`MultiTurnCase`) measures latency instead: concurrent episodes whose every
turn prompts with the whole conversation so far plus a new observation, one `generate` call per
turn, so the prefix cache serves the earlier turns and only the new tokens are prefilled.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TypeVar

import torch

from parity.core.types import SamplingParams
from parity.engine.bandwidth import copy_bandwidth, streamed_weight_bytes, tokens_per_s_limit
from parity.engine.config import EngineConfig
from parity.engine.engine import Engine
from parity.engine.multi_turn import BLOCK_SIZE, MultiTurnCase, observations, run_episodes
from parity.engine.shapes import random_model
from parity.model import Decoder
from parity.model.dtypes import bf16_support

MODES = ("aligned", "standard")


@dataclass(frozen=True)
class Case:
    name: str
    shape: str
    batch: int
    prompt_len: int
    new_tokens: int
    repeats: int = 3
    tie_word_embeddings: bool = False
    warm_prefix: bool = False  # prefill once untimed; the timed run hits the prefix cache

    def engine_config(self) -> EngineConfig:
        per_seq = -(-(self.prompt_len + self.new_tokens) // BLOCK_SIZE) + 1
        return EngineConfig(kv_blocks=self.batch * per_seq, max_batch_tokens=2048, max_seqs=self.batch)


CASES: tuple[Case, ...] = (
    Case("tiny batch 64 x 128 new", "tiny", batch=64, prompt_len=16, new_tokens=128),
    Case("tiny long context 8192 + 64 new", "tiny", batch=4, prompt_len=8192, new_tokens=64,
         warm_prefix=True),
    Case("qwen2-0.5b batch 8 x 64 new", "qwen2-0.5b", batch=8, prompt_len=16, new_tokens=64,
         tie_word_embeddings=True),
)
"""The default set."""

ON_REQUEST: tuple[MultiTurnCase, ...] = (
    MultiTurnCase("tiny multi-turn 4 x 16 turns x (992 + 32 new)", "tiny", episodes=4, turns=16,
                  observation_len=992, new_tokens=32),
)
"""Cases run only when a name filter selects them: too slow for the default set (the one here
took 19 minutes before vLLM's side on 2 loaded cores)."""


def _params(batch: int, new_tokens: int) -> list[SamplingParams]:
    """Request i samples at temperature 1 with seed i, exactly `new_tokens` tokens (no stop)."""
    return [SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i) for i in range(batch)]


def _requests(case: Case, vocab: int) -> tuple[list[list[int]], list[SamplingParams]]:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, vocab, (case.batch, case.prompt_len), generator=g).tolist()
    return prompts, _params(case.batch, case.new_tokens)


def _models(shape: str, tie_word_embeddings: bool) -> dict[str, Decoder]:
    """The shape's random fp32 model ("float32") and a bf16 copy of it ("bfloat16")."""
    overrides = {"tie_word_embeddings": True} if tie_word_embeddings else {}
    models = {"float32": random_model(shape, **overrides)}
    models["bfloat16"] = copy.deepcopy(models["float32"]).cast(torch.bfloat16)
    return models


T = TypeVar("T")
UNSTEADY = 0.15
"""A ratio whose rounds spread by more than this ((max - min) / median) is no result: it is
reported as None with its rounds, never as a figure."""


def _rounds(runs: dict[str, Callable[[int], T]], repeats: int) -> dict[str, list[T]]:
    """Every run's result in each of `repeats` rounds (round r calls `run(r)`), the runs
    interleaved within each round, so that a drift of the machine hits all of them alike."""
    out: dict[str, list[T]] = {name: [] for name in runs}
    for r in range(repeats):
        for name, run in runs.items():
            out[name].append(run(r))
    return out


def spread(values: Sequence[float]) -> float:
    """(max - min) / median of a figure's rounds."""
    return (max(values) - min(values)) / statistics.median(values)


def figure(values: Sequence[float], digits: int = 1) -> dict:
    """A figure over rounds: its median, each round, and their spread."""
    return {"median": round(statistics.median(values), digits),
            "rounds": [round(v, digits) for v in values], "spread": round(spread(values), 3)}


def ratio(a: Sequence[float], b: Sequence[float]) -> dict:
    """a ÷ b, round by round (each pair measured in the same round): the median of the round
    ratios as `value`, or None when they spread by more than UNSTEADY."""
    rs = [x / y for x, y in zip(a, b, strict=True)]
    steady = spread(rs) <= UNSTEADY
    return {"value": round(statistics.median(rs), 3) if steady else None,
            "rounds": [round(r, 3) for r in rs], "spread": round(spread(rs), 3)}


def _parity_runs(models: dict[str, Decoder], config: EngineConfig, warm_prompt: list[int],
                 measure: Callable[[Decoder, int], T]) -> dict[str, Callable[[int], T]]:
    """A round's measure per "dtype/mode" of parity's engine, each warmed up first with a
    generate of `warm_prompt` (OpenMP threads, RoPE table, allocator)."""
    warm = [SamplingParams(max_new_tokens=2, seed=0)]
    runs: dict[str, Callable[[int], T]] = {}
    for dtype, model in models.items():
        for mode in MODES:
            model.set_kernels(mode)
            Engine(model, config).generate([warm_prompt], warm)

            def run(r: int, model: Decoder = model, mode: str = mode) -> T:
                model.set_kernels(mode)
                return measure(model, r)

            runs[f"{dtype}/{mode}"] = run
    return runs


def _tokens_per_s(model: Decoder, case: Case, prompts: list[list[int]], params: list[SamplingParams]) -> float:
    eng = Engine(model, case.engine_config())
    if case.warm_prefix:
        eng.generate(prompts, [p.model_copy(update={"max_new_tokens": 1}) for p in params])
    start = time.perf_counter()
    outs = eng.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return sum(len(o.token_ids) for o in outs) / elapsed


def run_case(case: Case, bandwidth: float, vllm: bool = False, vllm_compiled: bool = False,
             vllm_bf16: bool = False, vllm_fp32: bool = True) -> dict:
    """tokens/s per kernel mode (the median of `case.repeats` rounds, with each round and their
    spread), aligned ÷ standard round by round (`ratio`: None when its rounds disagree by more
    than UNSTEADY), and each mode's fraction of the bound batch x `bandwidth` (bytes/s) ÷ weight
    bytes, in fp32; under "bf16" the same for the model held in bf16 (its bound from bf16
    weight bytes) and bf16 ÷ fp32 per mode. With `vllm` (eager, vLLM's own model and parity's
    decoder in it) or `vllm_compiled`, vLLM's tokens/s on the same fp32 weights and requests
    (parity.engine.vllm.bench), under "vllm_..."; with `vllm_bf16` too, the same two on the
    bf16 weights under "bf16" (two more servers: on the 0.5B shape the four did not fit in
    24 GB beside parity's models; `vllm_fp32` False leaves out the fp32 two); its servers
    start first and every round runs all of parity's and vLLM's runs in turn."""
    fp32_vllm = vllm_modes(vllm and vllm_fp32, vllm_compiled)
    models = _models(case.shape, case.tie_word_embeddings)
    prompts, params = _requests(case, models["float32"].config.vocab_size)
    runs = _parity_runs(models, case.engine_config(), prompts[0],
                        lambda m, _: _tokens_per_s(m, case, prompts, params))
    with ExitStack() as servers:
        if vllm or vllm_compiled:
            from parity.engine.vllm.bench import batch_server
        for name in fp32_vllm:
            _, compiled, aligned = VLLM_RUNS[name]
            runs[name] = servers.enter_context(batch_server(
                models["float32"], prompts, params, case.warm_prefix, compiled, aligned))
        for name in vllm_modes(vllm and vllm_bf16, False):  # on the bf16 model's weights
            runs[f"bfloat16/{name}"] = servers.enter_context(batch_server(
                models["bfloat16"], prompts, params, case.warm_prefix, False, VLLM_RUNS[name][2]))
        tps = _rounds(runs, case.repeats)
    for model in models.values():
        model.set_kernels("aligned")
    out: dict = {"case": case.name, "shape": case.shape, "batch": case.batch,
                 "prompt_len": case.prompt_len, "new_tokens": case.new_tokens,
                 "rounds": case.repeats}
    for dtype, model in models.items():
        limit = tokens_per_s_limit(case.batch, bandwidth, streamed_weight_bytes(model))
        a, s = tps[f"{dtype}/aligned"], tps[f"{dtype}/standard"]
        into = out if dtype == "float32" else out.setdefault("bf16", {})
        into.update({
            "aligned_tokens_per_s": figure(a), "standard_tokens_per_s": figure(s),
            "ratio": ratio(a, s), "weight_bytes": streamed_weight_bytes(model),
            "bandwidth_limit_tokens_per_s": round(limit, 1),
            "aligned_fraction_of_limit": round(statistics.median(a) / limit, 3),
            "standard_fraction_of_limit": round(statistics.median(s) / limit, 3),
        })
        if dtype != "float32":
            into.update({f"{m}_over_fp32": ratio(tps[f"{dtype}/{m}"], tps[f"float32/{m}"])
                         for m in MODES})
            for name in vllm_modes(vllm and vllm_bf16, False):
                v = tps[f"{dtype}/{name}"]
                into.update({f"{name}_tokens_per_s": figure(v),
                             f"aligned_over_{name}": ratio(tps[f"{dtype}/aligned"], v),
                             f"{name}_fraction_of_limit": round(statistics.median(v) / limit, 3)})
            if vllm and vllm_bf16:
                into["vllm_aligned_over_vllm"] = ratio(tps[f"{dtype}/vllm_aligned"],
                                                       tps[f"{dtype}/vllm"])
    for name in fp32_vllm:
        v = tps[name]
        out.update({f"{name}_tokens_per_s": figure(v),
                    f"aligned_over_{name}": ratio(tps["float32/aligned"], v),
                    f"{name}_fraction_of_limit": round(
                        statistics.median(v) / out["bandwidth_limit_tokens_per_s"], 3)})
    if "vllm_aligned" in tps:  # > 1: parity's decoder in vLLM is the faster
        out["vllm_aligned_over_vllm"] = ratio(tps["vllm_aligned"], tps["vllm"])
    return out


VLLM_RUNS = {"vllm": ("vLLM", False, False), "vllm_aligned": ("vLLM+parity", False, True),
             "vllm_compiled": ("vLLM compiled", True, False)}
"""vLLM's runs: the name of their keys in a case's report -> (label, compiled: vLLM's
torch.compile, aligned: parity's decoder inside vLLM, the vllm-aligned rollout engine)."""


def vllm_modes(vllm: bool, compiled: bool) -> list[str]:
    """vLLM's runs a case asks for (VLLM_RUNS names): with `vllm`, vLLM's own model and
    parity's decoder in it, side by side; with `compiled`, vLLM's own model compiled."""
    return [name for name, asked in (("vllm", vllm), ("vllm_aligned", vllm),
                                     ("vllm_compiled", compiled)) if asked]


def run_multi_turn_case(case: MultiTurnCase, vllm: bool = False, vllm_compiled: bool = False) -> dict:
    """Per kernel mode, the median run (by its seconds) of `case.repeats` rounds of the case's
    episodes (round r's observations drawn from seed r), as `Episodes.report`, with every
    round's mean turn latency, and standard ÷ aligned mean turn latency round by round (> 1:
    aligned is faster; None when its rounds disagree by more than UNSTEADY), in fp32 and under
    "bf16" for the model held in bf16; with `vllm`, the same episodes on vLLM (prefix caching
    on, its servers started first) with the fp32 weights, and vLLM ÷ aligned turn latency.
    Every round runs all of them in turn."""
    models = _models(case.shape, case.tie_word_embeddings)
    vocab = models["float32"].config.vocab_size
    params = _params(case.episodes, case.new_tokens)
    warm_prompt = observations(case, vocab, seed=case.repeats)[0][0]  # no timed run draws it
    runs = _parity_runs(models, case.engine_config(), warm_prompt, lambda m, r: run_episodes(
        Engine(m, case.engine_config()), observations(case, vocab, r), params))
    with ExitStack() as servers:
        for name in vllm_modes(vllm, vllm_compiled):
            from parity.engine.vllm.bench import episodes_server

            _, compiled, aligned = VLLM_RUNS[name]
            runs[name] = servers.enter_context(episodes_server(
                models["float32"], case, params, warm_prompt, compiled, aligned))
        episodes = _rounds(runs, case.repeats)
    for model in models.values():
        model.set_kernels("aligned")
    mean = {name: [e.report()["turn_ms_mean"] for e in runs_] for name, runs_ in episodes.items()}

    def report(name: str) -> dict:
        median = sorted(episodes[name], key=lambda e: e.seconds)[(len(episodes[name]) - 1) // 2]
        return median.report() | {"turn_ms_mean_rounds": mean[name]}

    out: dict = {"case": case.name, "shape": case.shape, "episodes": case.episodes,
                 "turns": case.turns, "observation_len": case.observation_len,
                 "new_tokens": case.new_tokens, "context_len": case.context_len,
                 "rounds": case.repeats}
    for dtype in models:
        into = out if dtype == "float32" else out.setdefault("bf16", {})
        into.update({m: report(f"{dtype}/{m}") for m in MODES})
        into["standard_over_aligned_latency"] = ratio(mean[f"{dtype}/standard"],
                                                      mean[f"{dtype}/aligned"])
    for name in vllm_modes(vllm, vllm_compiled):
        out[name] = report(name)
        out[f"{name}_over_aligned_latency"] = ratio(mean[name], mean["float32/aligned"])
    if "vllm_aligned" in episodes:  # < 1: parity's decoder in vLLM answers a turn sooner
        out["vllm_aligned_over_vllm_latency"] = ratio(mean["vllm_aligned"], mean["vllm"])
    return out


def run_bench(names: list[str] | None = None, vllm: bool = False, vllm_compiled: bool = False,
              vllm_bf16: bool = False, vllm_fp32: bool = True) -> dict:
    """Every default case (or those of CASES and ON_REQUEST whose name contains one of
    `names`); with `vllm` (eager) and/or `vllm_compiled`, vLLM's side too, when its
    environment is built ("vllm" says its version, or why it is missing)."""
    from parity.engine.vllm import VllmEnvError, check_vllm_env
    from parity.model.selfcheck import machine

    cases = list(CASES) if not names else [
        c for c in (*CASES, *ON_REQUEST) if any(n in c.name for n in names)]
    vllm_info = "not asked (--vllm)"
    if vllm or vllm_compiled:
        try:
            vllm_info = check_vllm_env()["version"]
        except VllmEnvError as e:
            vllm_info, vllm, vllm_compiled = str(e), False, False
    bandwidth = copy_bandwidth()
    return {"threads": torch.get_num_threads(), "machine": machine(), "bf16_support": bf16_support(),
            "copy_bandwidth_gb_s": round(bandwidth / 1e9, 2), "vllm": vllm_info,
            "cases": [run_multi_turn_case(c, vllm, vllm_compiled) if isinstance(c, MultiTurnCase)
                      else run_case(c, bandwidth, vllm, vllm_compiled, vllm_bf16, vllm_fp32)
                      for c in cases]}
