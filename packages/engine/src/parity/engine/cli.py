"""`parity bench engine`, and the pieces of `parity audit` (assembled by the trainer's CLI,
which adds the multi-node probe)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from parity.model import Decoder


def audit_targets(model_dirs: list[Path], shapes: list[str], kernels: str, dtype: str = "auto"
                  ) -> list[tuple[str, Callable[[], Decoder]]]:
    """(name, build) of each model to audit: the directories given, then the named random
    shapes; with neither, the default audit shapes. `dtype`: float32, bfloat16 or auto (a
    directory's torch_dtype, float32 for a shape). Raises ValueError (DtypeError) naming a bad
    one."""
    import torch

    from parity.engine.shapes import AUDIT_SHAPES, SHAPES, random_model
    from parity.model import load_model
    from parity.model.dtypes import DTYPES, require_dtype
    from parity.model.io import resolve_dtype

    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        raise ValueError(f"--shape {bad[0]!r} is not a known shape ({', '.join(SHAPES)})")
    if dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"--dtype must be auto, float32 or bfloat16, not {dtype!r}")
    if not model_dirs and not shapes:
        shapes = list(AUDIT_SHAPES)
    dirs = [(d, resolve_dtype(dtype, d, "--dtype")) for d in model_dirs]
    shape_dtype = DTYPES.get(dtype, torch.float32)
    require_dtype(shape_dtype, "--dtype")
    return [(str(d), lambda d=d, t=t: load_model(d, kernels=kernels, dtype=t)) for d, t in dirs] + \
           [(s, lambda s=s: random_model(s, kernels, dtype=shape_dtype)) for s in shapes]


def render_audit(report: dict) -> None:
    """The audit report as text: per model its proof, scenarios and token counts; a verdict."""
    from parity.engine.audit import UNCERTAIN

    m = report["machine"]
    on = "" if report.get("engine", "parity") == "parity" else ", generation on vLLM"
    typer.echo(f"parity audit: {report['kernels']} kernels in {report['dtype']} on {m['cpu']} "
               f"({m['torch_capability']}), "
               f"{m['mkl_mode'] or m['blas']}{on}")
    for e in report["models"]:
        if "error" in e:
            typer.echo(f"\n{e['model']}: REFUSED  {e['error']}")
            continue
        proof = e.get("selfcheck")
        head = f"\n{e['model']} ({e['family']}, {e['params'] / 1e6:.1f}M params, " \
               f"{e['heads']}/{e['kv_heads']} heads, K up to {max(e['hidden_size'], e['intermediate_size'])})"
        if proof:
            took = "cached" if proof["cached"] else f"{proof['seconds']:.1f} s"
            head += (f"  start-up proof: {'ok' if proof['ok'] else 'FAILED'} "
                     f"({proof['checks']} checks, {took})")
        typer.echo(head)
        for r in e["scenarios"]:
            mark = "equal " if r["bitwise_equal"] else "DIFFER"
            typer.echo(f"  {mark}  max|diff| {r['max_abs_diff']:<9.3g} tokens {r['tokens_compared']:4d} "
                       f"(uncertain {r['uncertain_tokens']:4d})  {r['name']}")
        if e.get("not_run"):
            typer.echo(f"  not run (they need the parity engine's step control): "
                       f"{', '.join(e['not_run'])}")
        n, u = e["tokens_compared"], e["uncertain_tokens"]
        verdict = "bit-identical" if e["all_bitwise_equal"] else "differences found"
        typer.echo(f"  {verdict}; {n} tokens compared, {u} with logprob < {UNCERTAIN} ({u / max(n, 1):.0%})"
                   + ("" if e["conclusive"] else "  INCONCLUSIVE: too few uncertain tokens "
                      "(a saturated softmax hides differences)"))
    expect = ("every model bit-identical on a conclusive audit" if report["kernels"] == "aligned"
              else "differences found in every model, on a conclusive audit")
    if report.get("engine") == "vllm":
        expect = "a conclusive measurement of vLLM's differences from the learner"
    typer.echo(f"\n{'passed' if report['passed'] else 'FAILED'}: {expect}"
               + ("" if report["passed"] else " — not so"))


def _ratio(r: dict) -> str:
    """A bench ratio as text: its median over rounds and their range, or why it is none."""
    lo, hi = min(r["rounds"]), max(r["rounds"])
    if r["value"] is None:
        return f"unsteady (rounds {lo:.3f}-{hi:.3f}, spread {r['spread']:.0%})"
    return f"{r['value']:.3f} ({lo:.3f}-{hi:.3f})"


def _figure(f: dict) -> str:
    """A bench figure as text: its median over rounds and their range."""
    return f"{f['median']:9.1f} ({min(f['rounds']):.0f}-{max(f['rounds']):.0f})"


def _echo_episodes(label: str, e: dict) -> None:
    """One mode's line of the multi-turn case: per-turn latency, episode time, cache use."""
    rounds = ", ".join(f"{m:.0f}" for m in e["turn_ms_mean_rounds"])
    typer.echo(f"    {label:18s} turn ms mean {e['turn_ms_mean']:9.1f} (rounds {rounds})  p50 "
               f"{e['turn_ms_p50']:9.1f}  p90 {e['turn_ms_p90']:9.1f}  max {e['turn_ms_max']:9.1f}"
               f"  episodes {e['episode_s']:7.2f} s  prompt tokens: {e['cached_tokens']} cached, "
               f"{e['prefilled_tokens']} prefilled")


def _echo_vllm(r: dict, dtype: str) -> None:
    """A batch case's vLLM runs (those it has, fp32 or, `dtype` "bf16  ", bf16) beside
    parity's aligned run."""
    from parity.engine.bench import VLLM_RUNS

    for name, (label, *_) in VLLM_RUNS.items():
        if f"{name}_tokens_per_s" in r:
            typer.echo(f"    {dtype}{label:13s} {_figure(r[f'{name}_tokens_per_s'])}  aligned ÷ "
                       f"{label} {_ratio(r[f'aligned_over_{name}'])}  ({label} "
                       f"{r[f'{name}_fraction_of_limit']:.0%} of the bound)")
    if "vllm_aligned_over_vllm" in r:
        typer.echo(f"    {dtype}vLLM+parity ÷ vLLM {_ratio(r['vllm_aligned_over_vllm'])}")


def _echo_multi_turn(r: dict) -> None:
    """The multi-turn case as text: each mode's line, in fp32 (and vLLM), then in bf16."""
    from parity.engine.bench import VLLM_RUNS

    typer.echo(f"  {r['case']}: {r['episodes']} episodes of {r['turns']} turns to "
               f"{r['context_len']} tokens (> 1: aligned has the lower mean turn latency)")
    for dtype, into in (("fp32", r), ("bf16", r["bf16"])):
        _echo_episodes(f"aligned {dtype}", into["aligned"])
        _echo_episodes(f"standard {dtype}", into["standard"])
        for name, (label, *_) in VLLM_RUNS.items():
            if dtype == "fp32" and name in r:
                _echo_episodes(f"{label} fp32", r[name])
                typer.echo(f"    {label} ÷ aligned turn latency "
                           f"{_ratio(r[f'{name}_over_aligned_latency'])}")
        if dtype == "fp32" and "vllm_aligned_over_vllm_latency" in r:
            typer.echo(f"    vLLM+parity ÷ vLLM turn latency "
                       f"{_ratio(r['vllm_aligned_over_vllm_latency'])}")
        typer.echo(f"    standard ÷ aligned turn latency in {dtype} "
                   f"{_ratio(into['standard_over_aligned_latency'])}")


def bench_engine(
    json_: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    case: Annotated[
        list[str] | None, typer.Option("--case", help="Run only cases whose name contains this (the multi-turn "
                                        "case runs only so: --case multi-turn).")
    ] = None,
    threads: int = typer.Option(0, "--threads", help="torch threads (0: leave torch's default)."),
    vllm: bool = typer.Option(False, "--vllm", help="Also time vLLM on the same weights and "
                              "requests, with its own model and with parity's decoder in it "
                              "(vllm-aligned); its environment: scripts/build_vllm_env.sh."),
    vllm_compiled: bool = typer.Option(False, "--vllm-compiled", help="Also time vLLM with its "
                                       "torch.compile (about a minute of start-up per case)."),
    vllm_bf16: bool = typer.Option(False, "--vllm-bf16", help="With --vllm, also time both on "
                                   "the bf16 weights: two more servers (the 0.5B case then "
                                   "needs more than 24 GB)."),
    vllm_bf16_only: bool = typer.Option(False, "--vllm-bf16-only", help="With --vllm, time "
                                        "both on the bf16 weights only (two servers: the 0.5B "
                                        "case fits in 24 GB)."),
) -> None:
    """Generation tokens/s, aligned vs standard kernels (and vLLM with --vllm), on the tiny
    and ~0.5B Qwen2 shapes; per-turn latency of multi-turn episodes on the tiny shape."""
    import torch

    from parity.engine.bench import run_bench

    if threads:
        torch.set_num_threads(threads)
    from parity.engine.bench import CASES, ON_REQUEST

    names = [c.name for c in (*CASES, *ON_REQUEST)]
    unknown = [n for n in case or [] if not any(n in name for name in names)]
    if unknown:
        typer.echo(f"error: --case {unknown[0]!r} matches no case; the cases: "
                   f"{', '.join(names)}", err=True)
        raise typer.Exit(2)
    report = run_bench(case or None, vllm=vllm, vllm_compiled=vllm_compiled,
                       vllm_bf16=vllm_bf16 or vllm_bf16_only, vllm_fp32=not vllm_bf16_only)
    if json_:
        typer.echo(json.dumps(report, indent=2))
        return
    m = report["machine"]
    typer.echo(f"threads: {report['threads']}; {m['cpu']}, {m['torch_capability']}, MKL {m['mkl_mode']}; "
               f"copy bandwidth {report['copy_bandwidth_gb_s']} GB/s")
    for r in report["cases"]:
        if "turns" in r:
            _echo_multi_turn(r)
            continue
        typer.echo(f"  {r['case']} ({r['rounds']} rounds; tok/s median (range))")
        typer.echo(f"    fp32  aligned {_figure(r['aligned_tokens_per_s'])}  standard "
                   f"{_figure(r['standard_tokens_per_s'])}  ratio {_ratio(r['ratio'])}  bound "
                   f"{r['bandwidth_limit_tokens_per_s']:.0f} (aligned "
                   f"{r['aligned_fraction_of_limit']:.0%})")
        _echo_vllm(r, "")
        b = r["bf16"]
        typer.echo(f"    bf16  aligned {_figure(b['aligned_tokens_per_s'])}  standard "
                   f"{_figure(b['standard_tokens_per_s'])}  ratio {_ratio(b['ratio'])}  bound "
                   f"{b['bandwidth_limit_tokens_per_s']:.0f} (aligned "
                   f"{b['aligned_fraction_of_limit']:.0%})  bf16 ÷ fp32: aligned "
                   f"{_ratio(b['aligned_over_fp32'])}, standard {_ratio(b['standard_over_fp32'])}")
        _echo_vllm(b, "bf16  ")
    s = report["bf16_support"]
    typer.echo(f"CPU bf16: AVX512-BF16 {s['avx512_bf16']}, AMX {s['amx_bf16']}, oneDNN bf16 {s['onednn_bf16']}")
    if (vllm or vllm_compiled) and not any(k.startswith("vllm") for r in report["cases"] for k in r):
        typer.echo(f"  vLLM not timed: {report['vllm']}")
