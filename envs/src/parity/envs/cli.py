"""`parity envs list|check|play` (stubs until the environments land)."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("list")
def list_envs(json_: bool = typer.Option(False, "--json")) -> None:
    """List the registered environments."""
    typer.echo("parity envs list: not built yet.", err=True)
    raise typer.Exit(2)
