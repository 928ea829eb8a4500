"""`parity bench learner`."""

from __future__ import annotations

import typer


def bench_learner(json_: bool = typer.Option(False, "--json")) -> None:
    """Forward+backward and forward-only tokens/s, aligned vs standard."""
    typer.echo("parity bench learner: not built yet.", err=True)
    raise typer.Exit(2)
