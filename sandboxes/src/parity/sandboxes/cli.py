"""`parity sandbox exec|check` and `parity bench sandbox`.

The sandbox modules (and docker) are imported inside the commands so `parity --help` stays fast.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_command(
    cmd: Annotated[list[str], typer.Argument(help="the command, after `--`")],
    backend: str = typer.Option("local", help="local or docker"),
    timeout: float | None = typer.Option(None, help="wall-clock seconds (default 10)"),
    memory_mb: int | None = typer.Option(None, "--memory-mb", help="memory in MiB (default 512)"),
    json_: bool = typer.Option(False, "--json", help="print the result as one JSON object"),
) -> None:
    """Run CMD in a fresh sandbox; stdin is passed through.

    Without --json, the command's stdout/stderr are replayed and its exit status is ours
    (128+N for signal N); flags go to stderr. With --json we exit 0 once the sandbox ran.
    """
    from pydantic import ValidationError

    from parity.sandboxes import Limits, SandboxError, open_sandbox

    fields = {k: v for k, v in (("timeout_s", timeout), ("memory_mb", memory_mb)) if v is not None}
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    try:
        limits = Limits(**fields)
        with open_sandbox(backend, limits) as sb:
            result = sb.run(cmd, stdin=stdin)
    except (SandboxError, ValidationError) as exc:
        typer.echo(f"parity sandbox exec: {exc}", err=True)
        raise typer.Exit(2) from exc
    if json_:
        typer.echo(json.dumps(result.to_json()))
        return
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    flags = [f for f in ("timed_out", "oom", "output_truncated") if getattr(result, f)]
    if flags:
        typer.echo(f"parity sandbox exec: {', '.join(flags)}", err=True)
    code = result.exit_code
    raise typer.Exit(code if code >= 0 else 128 - code)


@app.command("check")
def check(json_: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Report which backends work on this machine and why not; exit 1 when none works."""
    from parity.sandboxes import BACKENDS, check_backends

    report = check_backends()
    if json_:
        typer.echo(json.dumps(report))
    else:
        for name in BACKENDS:
            why = report[name]
            typer.echo(f"{name}: {'ok' if why is None else 'unavailable: ' + why}")
            if report.get(f"{name}_note"):
                typer.echo(f"  note: {report[f'{name}_note']}")
    if all(report[name] is not None for name in BACKENDS):
        raise typer.Exit(1)


def bench_sandbox(
    json_: bool = typer.Option(False, "--json", help="print one JSON object"),
    backend: Annotated[list[str] | None, typer.Option(help="backends to measure")] = None,
) -> None:
    """Sandbox latency (cold and warm p50/p99) and executions/s at concurrency 1 and 8."""
    from parity.sandboxes.bench import run_benchmark

    backend = backend or ["local", "docker"]
    report = run_benchmark(tuple(backend))
    if json_:
        typer.echo(json.dumps(report, indent=2))
        return
    for name in backend:
        row = report[name]
        if "unavailable" in row:
            typer.echo(f"{name}: unavailable: {row['unavailable']}")
            continue
        typer.echo(
            f"{name}: cold p50 {row['cold_p50_ms']:.1f} ms p99 {row['cold_p99_ms']:.1f} ms | "
            f"warm p50 {row['warm_p50_ms']:.1f} ms p99 {row['warm_p99_ms']:.1f} ms "
            f"(cold/warm {row['cold_over_warm_p50']:.1f}x) | exec/s c1 {row['exec_per_s_c1']:.0f} "
            f"c8 {row['exec_per_s_c8']:.0f} (c8/c1 {row['c8_over_c1']:.2f}x)"
        )
    typer.echo(f"goals: {report['goals_met']}")
