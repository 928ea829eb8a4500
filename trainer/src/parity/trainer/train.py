"""`parity train`: set up the run directory and Ray, run the orchestrator, write outputs."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from parity.trainer.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, remove_partial
from parity.trainer.config import TrainConfig, load_train_config
from parity.trainer.evaluate import heldout, model_dir_of
from parity.trainer.learner_actor import ModelIO
from parity.trainer.orchestrator import LearnerDied, Orchestrator, RunStopped
from parity.trainer.rollout import BackendFactory, EpisodeFactory
from parity.trainer.rundir import RunDir


def start_ray(address: str, cfg: TrainConfig) -> None:
    """Join the cluster at `address`, or start a local Ray sized to hold the actors even on
    a 2-core laptop (logical CPUs: the learner's plus the workers'), offering every custom
    resource the config places them with (`learner.resources`, `rollout.resources`)."""
    if not address:
        # Under `uv run`, Ray would rebuild the workspace into a fresh environment for its
        # workers; local workers share this interpreter's instead. And a local instance
        # listens on loopback only (Ray's "no cluster" mode). Both read at `import ray`.
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    r = cfg.rollout
    need = cfg.learner.num_cpus + r.workers * r.num_cpus_per_worker
    custom = {k: v + r.workers * r.resources.get(k, 0.0) for k, v in cfg.learner.resources.items()}
    custom |= {k: r.workers * v for k, v in r.resources.items() if k not in custom}
    # address="local": a Ray of its own, even when another job's Ray runs on this machine
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(need + 0.999)),
             resources=custom or None, include_dashboard=False, log_to_driver=True)


def run_training(cfg: TrainConfig, run_dir: Path, *, resume: bool = False,
                 io: ModelIO | None = None, backend_factory: BackendFactory | None = None,
                 episode_factory: EpisodeFactory | None = None,
                 progress: bool = False) -> dict[str, Any]:
    """Train `cfg` into `run_dir` (continuing its latest checkpoint if `resume`).

    The three factories default to parity.model, the parity engine and the env runner;
    tests and other backends pass their own. Before anything starts, the defaults are
    checked here (model files, the aligned kernels' proof, one oracle episode of the env).
    A learner actor that dies is restarted from the last checkpoint, up to
    `train.max_learner_restarts` times. Returns the run's summary; its wall times cover every
    process that worked on the run (resumes included)."""
    from parity.trainer import backends

    model_dir = backends.resolve_model_dir(cfg)
    if io is None:
        backends.check_model(cfg, model_dir)
    if episode_factory is None:
        backends.check_env(cfg)
    if cfg.rollout.engine == "vllm":
        print("parity train: rollout.engine = vllm: its logprobs are not bit-identical to the "
              "learner's; is/d3_mismatch logs the difference at every step", file=sys.stderr)
    run = RunDir(run_dir, tensorboard=cfg.output.tensorboard)
    segment = run.begin_segment()
    ckpt = _restart_point(run) if resume else None
    remove_partial(run.checkpoints)  # a fresh run in a used directory, too
    run.save_config(cfg)
    start_ray(cfg.train.ray_address, cfg)
    t0 = time.time()
    factories = (backend_factory, episode_factory)
    before = _heldout_before(cfg, run, model_dir, factories)
    t_train = time.time()

    def heartbeat(rec: dict[str, Any]) -> None:
        run.time_segment(segment, time.time() - t0, time.time() - t_train)
        if bar is not None:
            bar.update(rec)

    restarts = 0
    with _Progress(cfg) if progress else contextlib.nullcontext() as bar:
        while True:
            orch = Orchestrator(
                cfg, run, io or backends.parity_model_io(backends.run_dtype(cfg)),
                backend_factory or backends.engine_backend,
                episode_factory or backends.env_episodes,
                model_dir=model_dir, resume=ckpt, on_step=heartbeat,
            )
            orch.counters["learner_restarts"] += restarts
            if bar is not None:
                bar.start_at(orch.step)
            try:
                counters = orch.run()
                placement = orch.placement
                break
            except LearnerDied as e:
                restarts += 1
                if restarts > cfg.train.max_learner_restarts:
                    raise RunStopped(f"{e} (restarted {restarts - 1} times already; "
                                     f"train.max_learner_restarts = "
                                     f"{cfg.train.max_learner_restarts})") from e
                ckpt = _restart_point(run)
                where = ckpt.path.name if ckpt else "the start"
                print(f"parity train: {e}; restarting the run from {where} "
                      f"({restarts}/{cfg.train.max_learner_restarts})", file=sys.stderr)
    after = _heldout(cfg, model_dir_of(run.checkpoints / "latest"), factories)
    run.time_segment(segment, time.time() - t0, time.time() - t_train)
    segs = run.segments()
    # wall_s: the whole run a user waits for, held-out evaluations and every segment included
    return run.finish({"wall_s": sum(s["wall_s"] for s in segs),
                       "train_wall_s": sum(s["train_wall_s"] for s in segs),
                       "segments": len(segs),
                       "mode": cfg.train.mode, "max_lag": cfg.max_lag,
                       "heldout_success_before": before, "heldout_success_after": after,
                       "placement": placement, **counters}, plots=cfg.output.plots)


def _restart_point(run: RunDir) -> Checkpoint | None:
    """The run's latest checkpoint, its later records forgotten (they are redone); None,
    and everything forgotten, when the run never reached one. What a checkpoint write that
    was killed left behind is removed."""
    remove_partial(run.checkpoints)
    path = latest_checkpoint(run.checkpoints)
    ckpt = load_checkpoint(path) if path is not None else None
    run.truncate_from(ckpt.state["learner"]["version"] if ckpt else 0)
    return ckpt


def _heldout(cfg: TrainConfig, model_dir: Path | str, factories: tuple) -> float | None:
    n = cfg.eval.heldout_episodes
    return heldout(cfg, model_dir, n, *factories)["pass_rate"] if n else None


def _heldout_before(cfg: TrainConfig, run: RunDir, model_dir: str, factories: tuple
                    ) -> float | None:
    """The starting model's held-out success, measured once per run (kept across resumes)."""
    path = run.root / "heldout_before.json"
    if path.is_file():
        return json.loads(path.read_text())["pass_rate"]
    value = _heldout(cfg, model_dir, factories)
    path.write_text(json.dumps({"pass_rate": value}) + "\n")
    return value


def load_for_cli(config: Path | None, overrides: list[str], out: Path | None,
                 resume: Path | None, ray_address: str | None) -> tuple[TrainConfig, Path]:
    """Resolve the config and run directory of a `parity train` invocation."""
    if resume is not None:
        saved = resume / "config.toml"
        if not saved.is_file():
            raise FileNotFoundError(f"{resume}: no config.toml (not a run directory)")
        cfg = load_train_config(saved, overrides)
        run_dir = resume
    else:
        cfg = load_train_config(config, overrides)
        run_dir = out or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    if ray_address:
        cfg.train.ray_address = ray_address
    return cfg, run_dir


class _Progress:
    """A rich progress bar with the step's headline metrics."""

    def __init__(self, cfg: TrainConfig) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/"
                          "{task.total}"), TimeRemainingColumn(), TextColumn("{task.description}"))
        self.task = self.p.add_task("", total=cfg.train.steps)

    def start_at(self, done: int) -> None:
        self.p.update(self.task, completed=done)

    def __enter__(self) -> _Progress:
        self.p.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.p.__exit__(*exc)

    def update(self, rec: dict[str, Any]) -> None:
        desc = (f"reward {rec['reward/mean']:.3f} · d3 {rec['is/d3']:.2e} "
                f"(mismatch {rec.get('is/d3_mismatch', 0.0):.1e}) · lag {rec['lag/max']:.0f} · "
                f"{rec['throughput/tokens_per_s']:.0f} tok/s")
        self.p.update(self.task, advance=1, description=desc)
