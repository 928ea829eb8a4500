"""`parity train`: check the inputs, set up the run directory and Ray, train (the
orchestrator, restarted from the last checkpoint when the learner dies), write the outputs."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parity.trainer.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, remove_partial
from parity.trainer.config import TrainConfig
from parity.trainer.errors import LearnerDied, RunStopped
from parity.trainer.evaluate import heldout, model_dir_of
from parity.trainer.learner_actor import ModelIO
from parity.trainer.orchestrator import Orchestrator
from parity.trainer.ray_cluster import start_ray
from parity.trainer.rollout import BackendFactory, EpisodeFactory
from parity.trainer.rundir import WALL_PARTS, RunDir
from parity.trainer.train_cli import ProgressBar


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

    t0 = time.time()
    run = RunDir(run_dir)
    # check: a finished run does nothing; nothing starts on inputs that cannot work
    if resume:
        _refuse_finished(run, cfg)
    ckpt = _restart_point(run) if resume else None
    model_dir = backends.resolve_model_dir(cfg)
    if io is None:
        backends.check_model(cfg, model_dir)
    if episode_factory is None:
        backends.check_env(cfg)
    if cfg.rollout.engine == "vllm":  # vllm-aligned runs the learner's kernels
        print("parity train: rollout.engine = vllm: its logprobs are not bit-identical to the "
              "learner's; is/d3_mismatch logs the difference at every step", file=sys.stderr)
    # build: the run directory, Ray
    run.open_tensorboard(_version(ckpt) if resume else None, enabled=cfg.output.tensorboard)
    wall = _Wall(run, run.begin_segment(), t0)
    remove_partial(run.checkpoints)  # a fresh run in a used directory, too
    run.save_config(cfg)
    start_ray(cfg.train.ray_address, cfg)
    factories = (backend_factory, episode_factory)
    # train
    before = wall.heldout(lambda: _heldout_before(cfg, run, model_dir, factories))
    wall.train_start = time.time()
    with ProgressBar(cfg) if progress else contextlib.nullcontext() as bar:
        def on_step(rec: dict[str, Any]) -> None:
            wall.steps_s += rec["timing/step_s"]
            wall.record()
            if bar is not None:
                bar.update(rec)

        def make(resume: Checkpoint | None) -> Orchestrator:
            return Orchestrator(cfg, run, io or backends.parity_model_io(backends.run_dtype(cfg)),
                                backend_factory or backends.engine_backend,
                                episode_factory or backends.env_episodes,
                                model_dir=model_dir, resume=resume, on_step=on_step)

        orch = _train(cfg, run, ckpt, make, bar)
    wall.train_end = time.time()
    after = wall.heldout(lambda: _heldout(cfg, model_dir_of(run.checkpoints / "latest"),
                                          factories))
    wall.record()
    # close: the summary of every segment of the run
    segs = run.segments()
    # wall_s: the whole run a user waits for, every segment included; its parts add up to it
    return run.finish({"wall_s": sum(s["wall_s"] for s in segs),
                       **{k: sum(s.get(k, 0.0) for s in segs) for k in WALL_PARTS},
                       "train_wall_s": sum(s["train_wall_s"] for s in segs),
                       "segments": len(segs),
                       "mode": cfg.train.mode, "max_lag": cfg.max_lag,
                       "heldout_success_before": before, "heldout_success_after": after,
                       "placement": orch.fleet.placement, **orch.counts()},
                      plots=cfg.output.plots)


def _train(cfg: TrainConfig, run: RunDir, ckpt: Checkpoint | None,
           make: Callable[[Checkpoint | None], Orchestrator], bar: ProgressBar | None
           ) -> Orchestrator:
    """Run an orchestrator (`make`) from `ckpt` to the end; a learner that dies restarts
    the run from its last checkpoint, up to `train.max_learner_restarts` times. Returns the
    orchestrator that finished."""
    restarts = 0
    while True:
        orch = make(ckpt)
        orch.counters.learner_restarts += restarts
        if bar is not None:
            bar.start_at(orch.step)
        try:
            orch.run()
            return orch
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


class _Wall:
    """The seconds of this process's segment of the run (`RunDir.begin_segment`): in all,
    in held-out evaluation, in training steps, in the training loop."""

    def __init__(self, run: RunDir, segment: int, t0: float) -> None:
        self.run = run
        self.segment = segment
        self.t0 = t0  # when the process started on the run
        self.heldout_s = 0.0
        self.steps_s = 0.0
        self.train_start = t0  # the training loop's start, and end (None: it runs)
        self.train_end: float | None = None

    def heldout(self, measure: Callable[[], float | None]) -> float | None:
        """`measure()`, its seconds counted as held-out evaluation."""
        t = time.time()
        value = measure()
        self.heldout_s += time.time() - t
        return value

    def record(self) -> None:
        """Write the seconds so far into segments.json."""
        now = time.time()
        self.run.time_segment(self.segment, wall_s=now - self.t0,
                              train_wall_s=(self.train_end or now) - self.train_start,
                              steps_s=self.steps_s, heldout_s=self.heldout_s)


class RunFinished(Exception):
    """`--resume` of a run that has trained all its steps: nothing to do (its summary
    stands)."""


def _version(ckpt: Checkpoint | None) -> int:
    return ckpt.learner["version"] if ckpt else 0


def _refuse_finished(run: RunDir, cfg: TrainConfig) -> None:
    """RunFinished when the run has trained all `train.steps` and written its summary."""
    try:
        done = json.loads((run.root / "summary.json").read_text()).get("updates", 0)
    except (OSError, ValueError):
        return
    if done >= cfg.train.steps:
        raise RunFinished(f"{run.root} has trained all its {done} steps (train.steps = "
                          f"{cfg.train.steps}); to train on: parity train --resume {run.root} "
                          f"--set train.steps=N with N > {done}")


def _restart_point(run: RunDir) -> Checkpoint | None:
    """The run's latest checkpoint, its later records forgotten (they are redone); None,
    and everything forgotten, when the run never reached one. What a checkpoint write that
    was killed left behind is removed; a damaged checkpoint directory raises
    CheckpointError."""
    remove_partial(run.checkpoints)
    path = latest_checkpoint(run.checkpoints)
    ckpt = load_checkpoint(path) if path is not None else None
    run.truncate_from(_version(ckpt))
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
