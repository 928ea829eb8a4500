"""`parity audit` and `parity bench engine` (stubs until the engine lands)."""

from __future__ import annotations

import typer


def audit(json_: bool = typer.Option(False, "--json")) -> None:
    """Compare engine and learner logprobs bit for bit."""
    typer.echo("parity audit: the engine is not built yet.", err=True)
    raise typer.Exit(2)


def bench_engine(json_: bool = typer.Option(False, "--json")) -> None:
    """Generation tokens/s, aligned vs standard."""
    typer.echo("parity bench engine: the engine is not built yet.", err=True)
    raise typer.Exit(2)
