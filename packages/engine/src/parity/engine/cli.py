"""`parity audit` and `parity bench engine`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def audit(
    model: Annotated[
        Path | None, typer.Option("--model", help="HF model directory (default: a random tiny Qwen2).")
    ] = None,
    kernels: str = typer.Option("aligned", "--kernels", help="aligned or standard"),
    json_: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    seed: int = typer.Option(0, "--seed", help="Seeds prompts and sampling."),
) -> None:
    """Compare engine and learner per-token logprobs bit for bit; exit 1 if aligned mode differs."""
    if kernels not in ("aligned", "standard"):
        typer.echo(f"--kernels must be 'aligned' or 'standard', not {kernels!r}", err=True)
        raise typer.Exit(2)
    from parity.engine.audit import run_audit
    from parity.engine.shapes import random_model
    from parity.model import ModelConfigError, WeightsError, load_model

    try:
        decoder = load_model(model, kernels=kernels) if model else random_model("tiny", kernels)
    except (ModelConfigError, WeightsError) as e:
        typer.echo(f"parity audit: {e}", err=True)
        raise typer.Exit(2) from None
    report = run_audit(decoder, seed)
    if json_:
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(f"kernels: {report['kernels']}")
        for r in report["scenarios"]:
            mark = "equal " if r["bitwise_equal"] else "DIFFER"
            typer.echo(f"  {mark}  max|diff| {r['max_abs_diff']:.3g}  tokens {r['tokens_compared']:5d}  {r['name']}")
        typer.echo(f"all bitwise equal: {report['all_bitwise_equal']}")
    if kernels == "aligned" and not report["all_bitwise_equal"]:
        raise typer.Exit(1)


def bench_engine(
    json_: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    case: Annotated[
        list[str] | None, typer.Option("--case", help="Run only cases whose name contains this.")
    ] = None,
    threads: int = typer.Option(0, "--threads", help="torch threads (0: leave torch's default)."),
) -> None:
    """Generation tokens/s, aligned vs standard kernels, on the tiny and ~0.5B Qwen2 shapes."""
    import torch

    from parity.engine.bench import run_bench

    if threads:
        torch.set_num_threads(threads)
    report = run_bench(case or None)
    if json_:
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo(f"threads: {report['threads']}")
    for r in report["cases"]:
        typer.echo(f"  {r['case']:36s} aligned {r['aligned_tokens_per_s']:9.1f} tok/s  "
                   f"standard {r['standard_tokens_per_s']:9.1f} tok/s  ratio {r['ratio']:.3f}")
