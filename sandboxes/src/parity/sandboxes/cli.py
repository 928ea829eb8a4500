"""`parity sandbox exec|check` and `parity bench sandbox` (stubs until the sandboxes land)."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("check")
def check() -> None:
    """Report which backends work on this machine and why not."""
    typer.echo("parity sandbox check: not built yet.", err=True)
    raise typer.Exit(2)


def bench_sandbox(json_: bool = typer.Option(False, "--json")) -> None:
    """Sandbox latency and executions/s per backend."""
    typer.echo("parity bench sandbox: not built yet.", err=True)
    raise typer.Exit(2)
