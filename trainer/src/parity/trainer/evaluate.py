"""`parity eval`: a checkpoint's mean reward and pass rate on held-out task seeds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from parity.trainer.config import TrainConfig, load_train_config

HELD_OUT_SEED = 1_000_000  # task seeds from here on are never used for training


def evaluate(checkpoint: Path, env_id: str | None = None, n: int = 64) -> dict[str, Any]:
    """Run `n` episodes (one per held-out task) with the checkpoint's model."""
    from parity.trainer.backends import engine_backend, env_episodes

    model_dir = checkpoint / "model" if (checkpoint / "model").is_dir() else checkpoint
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{checkpoint}: neither a checkpoint nor a model directory")
    cfg = _run_config(checkpoint)
    cfg.model.path = str(model_dir)
    if env_id:
        cfg.env.id = env_id
    backend = engine_backend(cfg)
    episode = env_episodes(cfg)

    async def run_all() -> list[Any]:
        return await asyncio.gather(*(episode(backend.agenerate, HELD_OUT_SEED + i, i)
                                      for i in range(n)))

    trajs = asyncio.run(run_all())
    return {
        "checkpoint": str(checkpoint), "env": cfg.env.id, "n": n,
        "reward_mean": sum(t.reward for t in trajs) / n,
        "pass_rate": sum(bool(t.info.get("passed", t.reward > 0)) for t in trajs) / n,
    }


def _run_config(checkpoint: Path) -> TrainConfig:
    """The config of the run the checkpoint belongs to (run/checkpoints/step_N), else defaults."""
    saved = checkpoint.parent.parent / "config.toml"
    return load_train_config(saved if saved.is_file() else None)
