"""`parity bench learner`: training-forward speed, aligned vs standard, measured side by side.

Both modes run on the same weights and tokens, interleaved round by round so machine noise
hits both alike; the figure per mode is the median round.

Both modes also share the process's MKL setting, strict CNR (`parity.model.blas`), which
parity sets by default. What that setting costs is measured apart: the standard fwd+bwd in
fresh processes with and without it (MKL reads it once per process), alternated, medians
compared. The report names the CPU, torch's dispatch level and MKL's mode and branch.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from parity.model.decoder import Decoder
from parity.model.dtypes import DTYPES, bf16_support
from parity.model.logprobs import token_logprobs
from parity.model.shapes import SHAPES


@dataclass
class Case:
    shape: str
    batch: int
    seq_len: int
    rounds: int


CASES = [Case("tiny", 32, 128, 5), Case("qwen2-0.5b", 1, 256, 2)]
DTYPE_NAMES = ("float32", "bfloat16")  # every case runs in both, interleaved round by round


def _tokens_per_s(fn: Callable[[], None], tokens: int) -> float:
    t0 = time.perf_counter()
    fn()
    return tokens / (time.perf_counter() - t0)


@dataclass
class _Workload:
    """One case's model (seeded random fp32 weights: the learner's masters) and tokens, and
    its two timed passes in the model's current kernels and dtype."""

    model: Decoder
    tokens: torch.Tensor

    @classmethod
    def build(cls, case: Case, kernels: str) -> _Workload:
        torch.manual_seed(0)
        model = Decoder(SHAPES[case.shape], kernels)
        return cls(model, torch.randint(0, model.config.vocab_size, (case.batch, case.seq_len)))

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[0] * (self.tokens.shape[1] - 1)

    def fwd_bwd(self) -> None:
        self.model.zero_grad(set_to_none=True)
        token_logprobs(self.model, self.tokens).mean().backward()

    def fwd(self) -> None:
        with torch.no_grad():
            token_logprobs(self.model, self.tokens)


def bench_case(case: Case, progress: Callable[[str], None] = lambda _: None) -> dict:
    """tokens/s per pass, kernel mode and dtype (bf16: the fp32 masters computing in bf16, as
    the learner runs), all four interleaved in every round; the median round of each."""
    work = _Workload.build(case, "aligned")
    model, n = work.model, work.num_tokens
    fwd_bwd, fwd = work.fwd_bwd, work.fwd

    results: dict[tuple[str, str, str], list[float]] = {}
    for r in range(case.rounds + 1):  # round 0 warms up every combination
        for dtype in DTYPE_NAMES:
            model.compute_dtype = DTYPES[dtype]
            for mode in ("aligned", "standard"):
                model.set_kernels(mode)
                progress(f"{case.shape} round {r}/{case.rounds} {mode} {dtype}")
                for kind, fn in (("fwd_bwd", fwd_bwd), ("fwd", fwd)):
                    tps = _tokens_per_s(fn, n)
                    if r:
                        results.setdefault((dtype, kind, mode), []).append(tps)
    med = {k: statistics.median(v) for k, v in results.items()}
    out: dict = {"shape": case.shape, "batch": case.batch, "seq_len": case.seq_len,
                 "params": sum(p.numel() for p in model.parameters()), "rounds": case.rounds}
    for dtype in DTYPE_NAMES:
        into = out if dtype == "float32" else out.setdefault("bf16", {})
        for kind in ("fwd_bwd", "fwd"):
            a, s = med[(dtype, kind, "aligned")], med[(dtype, kind, "standard")]
            into[kind] = {"aligned_tokens_per_s": round(a, 1), "standard_tokens_per_s": round(s, 1),
                          "ratio": round(a / s, 3)}
            if dtype != "float32":
                into[kind].update({f"{m}_over_fp32": round(med[(dtype, kind, m)] / med[("float32", kind, m)], 3)
                                   for m in ("aligned", "standard")})
    return out


def _standard_fwd_bwd(case: Case) -> list[float]:
    """Standard-mode fwd+bwd tokens/s of each round after a warm-up (in this process)."""
    work = _Workload.build(case, "standard")
    return [_tokens_per_s(work.fwd_bwd, work.num_tokens) for _ in range(case.rounds + 1)][1:]


CNR_SETTINGS = {"strict": "AUTO,STRICT", "off": "AUTO"}


def cnr_cost(case: Case, repeats: int = 2, progress: Callable[[str], None] = lambda _: None) -> dict:
    """Standard fwd+bwd tokens/s with MKL's strict CNR mode on and off, fresh processes alternated."""
    rates: dict[str, list[float]] = {name: [] for name in CNR_SETTINGS}
    for r in range(repeats):
        for name, setting in CNR_SETTINGS.items():
            progress(f"{case.shape} MKL strict CNR {name}, process {r + 1}/{repeats}")
            out = subprocess.run(
                [sys.executable, "-m", "parity.model.bench", case.shape],
                env={**os.environ, "MKL_CBWR": setting}, capture_output=True, text=True, check=True,
            )
            rates[name] += json.loads(out.stdout.splitlines()[-1])
    on, off = statistics.median(rates["strict"]), statistics.median(rates["off"])
    return {"shape": case.shape, "pass": "fwd_bwd, standard kernels",
            "strict_tokens_per_s": round(on, 1), "off_tokens_per_s": round(off, 1),
            "ratio": round(on / off, 3)}


def run(shapes: list[str] | None = None, progress: Callable[[str], None] = lambda _: None) -> dict:
    from parity.model.selfcheck import machine

    cases = [c for c in CASES if shapes is None or c.shape in shapes]
    return {
        "threads": torch.get_num_threads(),
        "machine": machine(),
        "bf16_support": bf16_support(),
        "cases": [bench_case(c, progress) for c in cases],
        # the 0.5B shape would take minutes per process; the tiny one shows the GEMM setting's cost
        "mkl_strict_cnr_cost": [cnr_cost(c, progress=progress) for c in cases if c.shape == "tiny"],
    }


if __name__ == "__main__":  # a child of cnr_cost: MKL_CBWR was set before torch started
    (name,) = sys.argv[1:]
    print(json.dumps(_standard_fwd_bwd(next(c for c in CASES if c.shape == name))))
