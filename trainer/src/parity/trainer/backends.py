"""The default parts the orchestrator is assembled from: parity.model for the learner, the
parity engine for generation, the env runner for episodes. Imported lazily (inside Ray
actors), so the trainer's own modules load without them."""

from __future__ import annotations

from pathlib import Path

from parity.core.types import SamplingParams, Trajectory
from parity.trainer.config import TrainConfig
from parity.trainer.orchestrator import ModelIO
from parity.trainer.rollout import Backend, EpisodeFn, Generate


def parity_model_io() -> ModelIO:
    from parity.model import load_model, save_model, token_logprobs

    return ModelIO(load=lambda d, kernels: load_model(d, kernels=kernels),
                   save=lambda m, d: save_model(m, d), logprobs=token_logprobs)


def resolve_model_dir(cfg: TrainConfig) -> str:
    """`model.path`, or the embedded tiny model's directory when it is empty."""
    if cfg.model.path:
        p = Path(cfg.model.path)
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"model.path: {p} is not a model directory (no config.json)")
        return str(p)
    from parity.trainer.embedded import EMBEDDED_DIR

    if not (EMBEDDED_DIR / "config.json").is_file():
        raise FileNotFoundError(f"model.path is empty and the embedded model is not built "
                                f"({EMBEDDED_DIR} has no config.json); set model.path")
    return str(EMBEDDED_DIR)


def preflight(cfg: TrainConfig, model_dir: str) -> None:
    """What must hold before any actor starts: aligned kernels proved on this machine for
    the model's shapes (AlignmentError names what failed). Models that are not parity
    decoders (config.json parity cannot read) are left to their own loader."""
    if cfg.model.kernels != "aligned":
        return
    from parity.model import ModelConfig, ModelConfigError, require_alignment

    try:
        model_config = ModelConfig.from_pretrained(model_dir)
    except ModelConfigError:
        return
    require_alignment(model_config)


def engine_backend(cfg: TrainConfig) -> Backend:
    """The parity engine on the model at `model.path` (version 0 until weights arrive);
    the kernel mode is the model's."""
    from parity.engine import Engine, EngineConfig
    from parity.model import load_model

    model = load_model(resolve_model_dir(cfg), kernels=cfg.model.kernels)
    return Engine(model, EngineConfig(seed=cfg.train.seed))


def env_episodes(cfg: TrainConfig) -> EpisodeFn:
    """Episodes of `env.id` through the env runner; each episode gets its own env. The
    env uses the model directory's tokenizer when it has one."""
    from parity.envs.registry import make_env
    from parity.envs.runner import run_episode

    kwargs = dict(cfg.env.kwargs)
    model_dir = Path(resolve_model_dir(cfg))
    if (model_dir / "tokenizer.json").is_file():
        kwargs.setdefault("tokenizer", str(model_dir))

    async def episode(generate: Generate, task_seed: int, sampling_seed: int) -> Trajectory:
        env = make_env(cfg.env.id, **kwargs)
        # the learner computes π_θ at this temperature; top-p/top-k stay off so that μ is
        # a distribution the learner can reproduce
        sampling = SamplingParams(temperature=cfg.rollout.temperature,
                                  max_new_tokens=cfg.rollout.max_new_tokens, seed=sampling_seed)
        try:
            return await run_episode(env, generate, seed=task_seed, sampling=sampling,
                                     group_id=str(task_seed))
        finally:
            env.close()

    return episode
