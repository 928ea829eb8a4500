"""The `parity train` command's side of a run: resolving its config and run directory, and
its progress bar."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from parity.trainer.config import TrainConfig, load_train_config
from parity.trainer.rundir import describe_run, holds_run


class RunDirError(ValueError):
    """`--out` names a directory that holds a run: it is continued with --resume or replaced
    with --force, never trained into."""


def load_for_cli(config: Path | None, overrides: list[str], out: Path | None,
                 resume: Path | None, ray_address: str | None, force: bool = False
                 ) -> tuple[TrainConfig, Path]:
    """Resolve the config and run directory of a `parity train` invocation. A new run's
    directory must not hold a run already (RunDirError), unless `force`: then the caller
    clears it (`rundir.clear_run`)."""
    if resume is not None:
        if out is not None and out.resolve() != resume.resolve():
            raise RunDirError(f"--out {out} and --resume {resume}: a resumed run stays in its "
                              f"own directory; give one of them")
        saved = resume / "config.toml"
        if not saved.is_file():
            raise FileNotFoundError(f"{resume}: no config.toml (not a run directory)")
        cfg = load_train_config(saved, overrides)
        run_dir = resume
    else:
        cfg = load_train_config(config, overrides)
        run_dir = out or _new_run_dir()
        if holds_run(run_dir) and not force:
            raise RunDirError(f"--out {run_dir} holds a run ({describe_run(run_dir)}); "
                              f"continue it with: parity train --resume {run_dir}, or start "
                              f"over with --force (deletes that run), or pick another --out")
    if ray_address:
        cfg.train.ray_address = ray_address
    return cfg, run_dir


def _new_run_dir() -> Path:
    """runs/<date-time>, with a suffix when another run started in the same second."""
    base = Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


class ProgressBar:
    """A rich progress bar with the step's headline metrics."""

    def __init__(self, cfg: TrainConfig) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/"
                          "{task.total}"), TimeRemainingColumn(), TextColumn("{task.description}"))
        self.task = self.p.add_task("", total=cfg.train.steps)

    def start_at(self, done: int) -> None:
        self.p.update(self.task, completed=done)

    def __enter__(self) -> ProgressBar:
        self.p.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.p.__exit__(*exc)

    def update(self, rec: dict[str, Any]) -> None:
        desc = (f"reward {rec['reward/mean']:.3f} · d3 {rec['is/d3']:.2e} "
                f"(mismatch {rec.get('is/d3_mismatch', 0.0):.1e}) · lag {rec['lag/max']:.0f} · "
                f"{rec['throughput/tokens_per_s']:.0f} tok/s")
        self.p.update(self.task, advance=1, description=desc)
