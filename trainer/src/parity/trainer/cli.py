"""The `parity` command line. Each package owns its commands; this file only assembles them.

Heavy imports (torch, ray) happen inside the commands and the packages load their modules
lazily (`parity.model`, `parity.engine`), so `parity --help` answers at once
(`trainer/tests/test_cli_startup.py`).
"""

from __future__ import annotations

import typer

from parity.core.memory import ask_huge_pages, keep_freed_memory
from parity.engine.cli import bench_engine
from parity.envs.cli import app as envs_app
from parity.envs.desktop.cli import bench_desktop
from parity.model import blas
from parity.model.cli import bench_learner, convert_model
from parity.sandboxes.cli import app as sandbox_app
from parity.sandboxes.cli import bench_sandbox
from parity.trainer.commands import audit, bench_agent, bench_async, eval_checkpoint, profile, train

app = typer.Typer(
    name="parity",
    help="Agentic RL whose rollout and learner compute bit-identical log-probabilities.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # docstring paragraphs reflow to the terminal's width
)
app.command("train")(train)
app.command("eval")(eval_checkpoint)
app.command("profile")(profile)
app.command("audit")(audit)

bench_app = typer.Typer(help="Side-by-side speed measurements; prints ratios.", no_args_is_help=True)
bench_app.command("learner")(bench_learner)
bench_app.command("engine")(bench_engine)
bench_app.command("sandbox")(bench_sandbox)
bench_app.command("async")(bench_async)
bench_app.command("desktop")(bench_desktop)
bench_app.command("agent")(bench_agent)
app.add_typer(bench_app, name="bench")
model_app = typer.Typer(help="Model directories.", no_args_is_help=True)
model_app.command("convert")(convert_model)
app.add_typer(model_app, name="model")
app.add_typer(sandbox_app, name="sandbox", help="Run commands in a sandbox; check backends.")
app.add_typer(envs_app, name="envs", help="List, check and play environments.")


def main() -> None:
    # Each only sets process state (environment variables, malloc's options) and imports no
    # torch, so they run before any command's first import of torch and its first GEMM.
    blas.configure()  # MKL's mode, before any command's first GEMM; Ray workers inherit it
    keep_freed_memory()  # each step's tensors reuse pages instead of faulting new ones in
    ask_huge_pages()  # weights stream through fewer TLB entries (before torch's first tensor)
    app()
