"""`parity bench engine`: generation tokens/s, aligned vs standard kernels, side by side.

tokens/s = generated tokens / wall time of `Engine.generate` (prefill included), except in
the long-context case, whose 8192-token prompts are prefilled once before the clock starts
(the timed run finds them in the prefix cache): it measures decode against a long KV.

Each case builds one random-weight model and a bf16 copy of it, then runs the same requests
under each kernel mode and dtype in turn (best of `repeats` interleaved runs, after a warm-up),
so the ratios compare like with like on the same machine at the same moment. Each case also reports the
memory-bandwidth bound batch x bandwidth / weight bytes (`parity.engine.bandwidth`), from a
copy benchmark run in the same process, and the fraction of it each mode reached.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from parity.core.types import SamplingParams
from parity.engine.bandwidth import copy_bandwidth, streamed_weight_bytes, tokens_per_s_limit
from parity.engine.config import EngineConfig
from parity.engine.engine import Engine
from parity.engine.shapes import random_model
from parity.model import Decoder
from parity.model.dtypes import bf16_support


@dataclass(frozen=True)
class Case:
    name: str
    shape: str
    batch: int
    prompt_len: int
    new_tokens: int
    repeats: int = 2
    tie_word_embeddings: bool = False
    warm_prefix: bool = False  # prefill once untimed; the timed run hits the prefix cache

    def engine_config(self) -> EngineConfig:
        per_seq = -(-(self.prompt_len + self.new_tokens) // 16) + 1
        return EngineConfig(kv_blocks=self.batch * per_seq, max_batch_tokens=2048, max_seqs=self.batch)


CASES = (
    Case("tiny batch 64 x 128 new", "tiny", batch=64, prompt_len=16, new_tokens=128),
    Case("tiny long context 8192 + 64 new", "tiny", batch=4, prompt_len=8192, new_tokens=64,
         repeats=2, warm_prefix=True),
    Case("qwen2-0.5b batch 8 x 64 new", "qwen2-0.5b", batch=8, prompt_len=16, new_tokens=64,
         repeats=1, tie_word_embeddings=True),
)


def _requests(case: Case, vocab: int) -> tuple[list[list[int]], list[SamplingParams]]:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, vocab, (case.batch, case.prompt_len), generator=g).tolist()
    params = [SamplingParams(temperature=1.0, max_new_tokens=case.new_tokens, seed=i) for i in range(case.batch)]
    return prompts, params


def _tokens_per_s(model: Decoder, case: Case, prompts: list[list[int]], params: list[SamplingParams]) -> float:
    eng = Engine(model, case.engine_config())
    if case.warm_prefix:
        eng.generate(prompts, [p.model_copy(update={"max_new_tokens": 1}) for p in params])
    start = time.perf_counter()
    outs = eng.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return sum(len(o.token_ids) for o in outs) / elapsed


def run_case(case: Case, bandwidth: float, vllm: bool = False) -> dict:
    """tokens/s per kernel mode, ratio = aligned / standard, and each mode's fraction of the
    bound batch x `bandwidth` (bytes/s) / weight bytes, for one case in fp32; under "bf16" the
    same for the model held in bf16 (its bound from bf16 weight bytes) and bf16 ÷ fp32 per
    mode, all four runs interleaved per repeat; with `vllm`, vLLM's tokens/s on the same fp32
    weights and requests too (parity.engine.vllm.bench)."""
    overrides = {"tie_word_embeddings": True} if case.tie_word_embeddings else {}
    models = {"float32": random_model(case.shape, **overrides)}
    models["bfloat16"] = copy.deepcopy(models["float32"]).cast(torch.bfloat16)
    prompts, params = _requests(case, models["float32"].config.vocab_size)
    warm = [SamplingParams(max_new_tokens=2, seed=0)]
    runs = [(dtype, mode) for dtype in models for mode in ("aligned", "standard")]
    best = dict.fromkeys(runs, 0.0)
    for dtype, mode in runs:  # warm-up: OpenMP threads, RoPE table, allocator
        models[dtype].set_kernels(mode)
        Engine(models[dtype], case.engine_config()).generate(prompts[:1], warm)
    for _ in range(case.repeats):
        for dtype, mode in runs:
            models[dtype].set_kernels(mode)
            best[dtype, mode] = max(best[dtype, mode], _tokens_per_s(models[dtype], case, prompts, params))
    out: dict = {"case": case.name, "shape": case.shape, "batch": case.batch,
                 "prompt_len": case.prompt_len, "new_tokens": case.new_tokens}
    for dtype, model in models.items():
        model.set_kernels("aligned")
        weight_bytes = streamed_weight_bytes(model)
        limit = tokens_per_s_limit(case.batch, bandwidth, weight_bytes)
        a, s = best[dtype, "aligned"], best[dtype, "standard"]
        into = out if dtype == "float32" else out.setdefault("bf16", {})
        into.update({
            "aligned_tokens_per_s": round(a, 1),
            "standard_tokens_per_s": round(s, 1),
            "ratio": round(a / s, 3),
            "weight_bytes": weight_bytes,
            "bandwidth_limit_tokens_per_s": round(limit, 1),
            "aligned_fraction_of_limit": round(a / limit, 3),
            "standard_fraction_of_limit": round(s / limit, 3),
        })
        if dtype != "float32":
            into.update({f"{m}_over_fp32": round(best[dtype, m] / best["float32", m], 3)
                         for m in ("aligned", "standard")})
    if vllm:
        from parity.engine.vllm.bench import vllm_tokens_per_s

        limit = out["bandwidth_limit_tokens_per_s"]
        tps = vllm_tokens_per_s(models["float32"], prompts, params, case.repeats, case.warm_prefix)
        out.update({"vllm_tokens_per_s": round(tps, 1),
                    "aligned_over_vllm": round(out["aligned_tokens_per_s"] / tps, 3),
                    "vllm_fraction_of_limit": round(tps / limit, 3)})
    return out


def run_bench(names: list[str] | None = None, vllm: bool = False) -> dict:
    """Every case (or those whose name contains one of `names`); with `vllm`, vLLM's side
    too, when its environment is built ("vllm" says its version, or why it is missing)."""
    from parity.engine.vllm import VllmEnvError, check_vllm_env
    from parity.model.selfcheck import machine

    cases = [c for c in CASES if not names or any(n in c.name for n in names)]
    vllm_info = "not asked (--vllm)"
    if vllm:
        try:
            vllm_info = check_vllm_env()["version"]
        except VllmEnvError as e:
            vllm_info, vllm = str(e), False
    bandwidth = copy_bandwidth()
    return {"threads": torch.get_num_threads(), "machine": machine(), "bf16_support": bf16_support(),
            "copy_bandwidth_gb_s": round(bandwidth / 1e9, 2), "vllm": vllm_info,
            "cases": [run_case(c, bandwidth, vllm) for c in cases]}
