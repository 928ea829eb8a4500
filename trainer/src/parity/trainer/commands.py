"""`parity train`, `eval`, `profile` and `bench async` (stubs until the trainer lands)."""

from __future__ import annotations

from pathlib import Path

import typer


def train(
    config: Path | None = typer.Argument(None, help="A TOML config; the embedded default if omitted."),
    set_: list[str] = typer.Option([], "--set", help="Override a key: --set train.lr=3e-4"),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default runs/<time>)."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the run in this directory."),
) -> None:
    """Train with asynchronous REINFORCE Zero."""
    typer.echo("parity train: the trainer is not built yet.", err=True)
    raise typer.Exit(2)


def eval_checkpoint(
    checkpoint: Path = typer.Argument(..., help="A checkpoint directory."),
    env: str | None = typer.Option(None, "--env"),
    n: int = typer.Option(64, "--n"),
) -> None:
    """Evaluate a checkpoint on held-out tasks."""
    typer.echo("parity eval: the trainer is not built yet.", err=True)
    raise typer.Exit(2)


def profile(run_dir: Path = typer.Argument(...), json_: bool = typer.Option(False, "--json")) -> None:
    """Where a run's wall time went."""
    typer.echo("parity profile: the trainer is not built yet.", err=True)
    raise typer.Exit(2)


def bench_async(json_: bool = typer.Option(False, "--json")) -> None:
    """Sync vs async training: updates per hour and final reward."""
    typer.echo("parity bench async: the trainer is not built yet.", err=True)
    raise typer.Exit(2)
