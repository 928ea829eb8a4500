"""Held-out success: a model's mean reward and pass rate on task seeds never trained on.

Used by `parity eval` and by `parity train`, which measures the model before and after.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parity.core.types import Trajectory
from parity.trainer.config import EvalSection, TrainConfig, load_train_config
from parity.trainer.failures import describe, failure_metrics
from parity.trainer.rollout import BackendFactory, EpisodeFactory

HELD_OUT_SEED = 1_000_000  # task seeds from here on are never used for training


def pass_rate(trajs: Sequence[Trajectory]) -> float:
    """The fraction of episodes whose reward is > 0, out of all of them: a failed episode
    (`Trajectory.failure`, unscored, reward 0) counts as not passed."""
    return sum(t.reward > 0 for t in trajs) / len(trajs)


def model_dir_of(checkpoint: Path) -> Path:
    """A model directory, a checkpoint (…/step_N with model/), a run's checkpoints/latest,
    or a run directory (its latest checkpoint)."""
    from parity.trainer.checkpoint import latest_checkpoint

    if (checkpoint / "checkpoints").is_dir():
        latest = latest_checkpoint(checkpoint / "checkpoints")
        if latest is None:
            raise FileNotFoundError(f"{checkpoint}: a run directory without a checkpoint yet")
        checkpoint = latest
    if checkpoint.is_file() and checkpoint.name == "latest":
        checkpoint = checkpoint.parent / checkpoint.read_text().strip()
    model_dir = checkpoint / "model" if (checkpoint / "model").is_dir() else checkpoint
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{checkpoint}: neither a run directory, a checkpoint nor a "
                                f"model directory")
    return model_dir


def heldout(cfg: TrainConfig, model_dir: Path | str, n: int,
            backend_factory: BackendFactory | None = None,
            episode_factory: EpisodeFactory | None = None, show: int = 0) -> dict[str, Any]:
    """Run `n` episodes, one per held-out task, with the model in `model_dir` (through the
    same backend and episode factories training uses; parity's engine and env by default).
    `show`: also return the first `show` episodes whole (`rundir.sample_episode`)."""
    from parity.trainer.backends import engine_backend, env_episodes
    from parity.trainer.rundir import sample_episode

    cfg = cfg.model_copy(deep=True)
    cfg.model.path = str(model_dir)
    # a sandbox per episode: a pool would outlive this call (it lives as long as the process
    # that made it) and hold fewer sandboxes than the n episodes run at once
    cfg.env.sandbox_pool = False
    backend = (backend_factory or engine_backend)(cfg)
    episode = (episode_factory or env_episodes)(cfg)

    async def run_all() -> list[Any]:
        return await asyncio.gather(*(episode(backend.agenerate, HELD_OUT_SEED + i, i)
                                      for i in range(n)))

    trajs = asyncio.run(run_all())
    if any(t.failure for t in trajs):  # not the policy's doing: say so beside the figure
        print(f"parity: held-out: {describe(trajs)} outside the agent; they count as not "
              f"passed (failures in the result)", file=sys.stderr)
    return {
        "reward_mean": sum(t.reward for t in trajs) / n,
        "pass_rate": pass_rate(trajs),
        "failures": failure_metrics(trajs)["env/failures/total"],
        **({"samples": [sample_episode(t) for t in trajs[:show]]} if show else {}),
    }


def evaluate(checkpoint: Path, env_id: str | None = None, n: int | None = None,
             overrides: list[str] | None = None, show: int = 0) -> dict[str, Any]:
    """`parity eval`: held-out results of a checkpoint (or a run's latest) under its run's
    config, on `n` episodes (default: as many as its run's held-out evaluations, so the
    figures compare). `env_id` replaces the run's env and its kwargs; `overrides` are
    `--set KEY=VALUE` items (env.kwargs.* among them). The env is made once first, so a bad
    id or kwargs raise EnvConfigError before any model loads."""
    from parity.envs.preflight import make_configured
    from parity.trainer.backends import env_kwargs

    model_dir = model_dir_of(checkpoint)
    new_env = [f"env.id={json.dumps(env_id)}", "env.kwargs={}"] if env_id else []
    cfg = _run_config(model_dir, new_env + (overrides or []))
    cfg.model.path = str(model_dir)
    make_configured(cfg.env.id, env_kwargs(cfg)).close()
    if n is None:
        n = cfg.eval.heldout_episodes or EvalSection.model_fields["heldout_episodes"].default
    return {"checkpoint": str(checkpoint), "env": cfg.env.id, "n": n,
            **heldout(cfg, model_dir, n, show=show)}


def _run_config(model_dir: Path, overrides: list[str]) -> TrainConfig:
    """The config of the run a checkpoint's model belongs to (run/checkpoints/step_N/model),
    else the defaults; `overrides` applied."""
    saved = model_dir.parent.parent.parent / "config.toml"
    return load_train_config(saved if saved.is_file() else None, overrides)
