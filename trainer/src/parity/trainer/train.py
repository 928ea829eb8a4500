"""`parity train`: set up the run directory and Ray, run the orchestrator, write outputs."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from parity.trainer.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, remove_partial
from parity.trainer.config import TrainConfig, load_train_config
from parity.trainer.evaluate import heldout, model_dir_of
from parity.trainer.learner_actor import ModelIO
from parity.trainer.orchestrator import LearnerDied, Orchestrator, RunStopped
from parity.trainer.rollout import BackendFactory, EpisodeFactory
from parity.trainer.rundir import WALL_PARTS, RunDir, describe_run, holds_run


def start_ray(address: str, cfg: TrainConfig) -> None:
    """Join the cluster at `address` (ClusterUnreachable within `train.start_timeout_s` if
    it does not answer), or start a local Ray sized to hold the actors even on a 2-core
    laptop (logical CPUs: the learner's plus the workers'), offering every custom resource
    the config places them with (`learner.resources`, `rollout.resources`)."""
    if not address:
        # Under `uv run`, Ray would rebuild the workspace into a fresh environment for its
        # workers; local workers share this interpreter's instead. And a local instance
        # listens on loopback only (Ray's "no cluster" mode). Both read at `import ray`.
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        # token authentication, as Ray's default for a new local cluster, chosen explicitly
        # (Ray warns on every run while the mode is left unset)
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray

    if ray.is_initialized():
        return
    if address:
        _join(address, cfg.train.start_timeout_s)
        return
    r = cfg.rollout
    need = cfg.learner.num_cpus + r.workers * r.num_cpus_per_worker
    custom = {k: v + r.workers * r.resources.get(k, 0.0) for k, v in cfg.learner.resources.items()}
    custom |= {k: r.workers * v for k, v in r.resources.items() if k not in custom}
    # address="local": a Ray of its own, even when another job's Ray runs on this machine
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(need + 0.999)),
             resources=custom or None, include_dashboard=False, log_to_driver=True)


class ClusterUnreachable(ConnectionError):
    """`--ray-address` names a cluster that did not answer within train.start_timeout_s."""


def _join(address: str, timeout: float) -> None:
    """ray.init(address) within `timeout` seconds. Ray itself retries an unreachable head
    for minutes, so its port is tried first (nothing listening ends here, quietly), then
    ray.init runs in a thread that is abandoned, with the process, when it overruns."""
    import ray

    deadline = time.monotonic() + timeout
    unreachable = (f"the Ray cluster at --ray-address {address} did not answer within "
                   f"train.start_timeout_s = {timeout:g} s")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        while True:
            try:
                socket.create_connection((host, int(port)),
                                         timeout=max(0.1, min(5.0, deadline - time.monotonic()))
                                         ).close()
                break
            except OSError as e:
                if time.monotonic() + 1.0 >= deadline:
                    raise ClusterUnreachable(f"{unreachable} ({host}:{port}: {e})") from e
                time.sleep(1.0)
    failure: list[BaseException] = []

    def connect() -> None:
        try:
            ray.init(address=address, log_to_driver=True)
        except BaseException as e:  # handed to the caller's thread
            failure.append(e)

    thread = threading.Thread(target=connect, name="ray-init", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if thread.is_alive():
        raise ClusterUnreachable(f"{unreachable} (its port answers, Ray does not)")
    if failure:
        raise ClusterUnreachable(f"cannot join the Ray cluster at --ray-address {address}: "
                                 f"{type(failure[0]).__name__}: {failure[0]}") from failure[0]


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
    if resume:  # first: a finished run does nothing
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
    run.open_tensorboard(_version(ckpt) if resume else None, enabled=cfg.output.tensorboard)
    segment = run.begin_segment()
    remove_partial(run.checkpoints)  # a fresh run in a used directory, too
    run.save_config(cfg)
    start_ray(cfg.train.ray_address, cfg)
    factories = (backend_factory, episode_factory)
    heldout_s = 0.0
    steps_s = 0.0

    def timed_heldout(model: Path | str, before: bool) -> float | None:
        nonlocal heldout_s
        t = time.time()
        value = _heldout_before(cfg, run, model, factories) if before else \
            _heldout(cfg, model, factories)
        heldout_s += time.time() - t
        return value

    def record_time(train_end: float | None = None) -> None:
        now = time.time()
        run.time_segment(segment, wall_s=now - t0, train_wall_s=(train_end or now) - t_train,
                         steps_s=steps_s, heldout_s=heldout_s)

    def heartbeat(rec: dict[str, Any]) -> None:
        nonlocal steps_s
        steps_s += rec["timing/step_s"]
        record_time()
        if bar is not None:
            bar.update(rec)

    before = timed_heldout(model_dir, before=True)
    t_train = time.time()
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
    train_end = time.time()
    after = timed_heldout(model_dir_of(run.checkpoints / "latest"), before=False)
    record_time(train_end)
    segs = run.segments()
    # wall_s: the whole run a user waits for, every segment included; its parts add up to it
    return run.finish({"wall_s": sum(s["wall_s"] for s in segs),
                       **{k: sum(s.get(k, 0.0) for s in segs) for k in WALL_PARTS},
                       "train_wall_s": sum(s["train_wall_s"] for s in segs),
                       "segments": len(segs),
                       "mode": cfg.train.mode, "max_lag": cfg.max_lag,
                       "heldout_success_before": before, "heldout_success_after": after,
                       "placement": placement, **counters}, plots=cfg.output.plots)


class RunFinished(Exception):
    """`--resume` of a run that has trained all its steps: nothing to do (its summary
    stands)."""


def _version(ckpt: Checkpoint | None) -> int:
    return ckpt.state["learner"]["version"] if ckpt else 0


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
