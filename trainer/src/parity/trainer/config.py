"""The trainer's typed config: one TOML file, sections below; unknown keys are errors.

`parity train cfg.toml --set loss.is_mode=tis` loads it through `parity.core.config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from parity.core.config import StrictModel, load_config
from parity.engine.config import EngineLimits
from parity.engine.vllm.settings import VllmOptions
from parity.trainer.embedded import EMBEDDED_ENV


class ModelSection(StrictModel):
    path: str = Field("", description="HF-style model dir (config.json + safetensors); "
                                      "empty: the embedded tiny model")
    kernels: Literal["aligned", "standard"] = "aligned"
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="what the model computes in (activations, KV cache, published "
        "weights; the learner keeps fp32 masters): auto, the checkpoint's torch_dtype")


class EnvSection(StrictModel):
    """Defaults: the embedded default's environment."""

    id: str = Field(EMBEDDED_ENV["id"], description="gymnasium id of the environment")
    kwargs: dict[str, Any] = Field(default_factory=lambda: dict(EMBEDDED_ENV["kwargs"]),
                                   description="passed to the env's constructor")
    task_seed: int = Field(0, description="first task seed; the data cursor counts up from it")
    sandbox_pool: bool = Field(True, description="each rollout worker keeps one pool of warm "
                               "sandboxes (rollout.group_size x rollout.max_groups_in_flight), "
                               "reset between episodes, for an env that lends from one (its "
                               "class has `pool_for`); off: every episode starts and stops "
                               "its own sandbox")

    @model_validator(mode="before")
    @classmethod
    def _kwargs_change_the_embedded_env(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        # A named env (in the file or by --set, which both arrive here merged) gets only the
        # kwargs given: the embedded env's are for another constructor (Math has no `kinds`).
        if "id" in data:
            return {"kwargs": {}, **data}
        # No env named: this is the embedded default's env, and the kwargs given change its
        # kwargs (`--set env.kwargs.backend="docker"` is the default job on docker) instead of
        # replacing them, which dropped its task settings for tasks its model cannot solve.
        if isinstance(data.get("kwargs"), dict):
            return {**data, "kwargs": {**EMBEDDED_ENV["kwargs"], **data["kwargs"]}}
        return data


class ActorPlacement(StrictModel):
    """Where an actor (the learner, each rollout worker) runs and how many CPU threads it
    computes with."""

    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray "
                                        "resources it needs, e.g. {rollout = 1}: it runs only "
                                        "on nodes started with them (`ray start --resources`); "
                                        "a local Ray offers them all")
    num_threads: int = Field(0, ge=0, description="torch CPU threads; 0: its Ray CPUs "
                             "(num_cpus, num_cpus_per_worker), rounded")
    cpu_affinity: list[int] = Field(default_factory=list, description="CPU cores its process "
                                    "may run on (sched_setaffinity); empty: any")


class RolloutSection(ActorPlacement):
    engine: Literal["parity", "vllm", "vllm-aligned"] = Field(
        "parity", description="parity: parity's aligned engine (bit-identical logprobs); "
        "vllm-aligned: vLLM (its own environment, [vllm] section) running parity's decoder "
        "and kernels (bit-identical logprobs, model.kernels = aligned); vllm: vLLM's own "
        "model, whose mismatch is/d3_mismatch measures")
    workers: int = Field(1, ge=1, description="number of rollout worker actors")
    num_cpus_per_worker: float = Field(1.0, gt=0)
    num_gpus_per_worker: float = Field(0.0, ge=0)
    placement: Literal["pack", "spread"] = Field("pack", description="Ray placement strategy")
    group_size: int = Field(8, ge=1, description="G: responses per prompt")
    groups_per_step: int = Field(4, ge=1, description="groups the learner consumes per update")
    max_groups_in_flight: int = Field(4, ge=1, description="concurrent groups per worker")
    temperature: float = Field(1.0, gt=0, description="sampling temperature; the learner "
                                                      "computes π_θ at the same temperature")
    max_new_tokens: int = Field(64, ge=1, description="per turn")
    in_flight_updates: bool = Field(False, description="apply new weights mid-episode")
    max_restarts: int = Field(3, ge=0, description="restarts of a crashed, hung or lost "
                              "worker")


class LearnerSection(ActorPlacement):
    ranks: int = Field(1, ge=1, description="data-parallel learner ranks, one Ray actor each "
                       "(num_cpus, num_gpus and resources are per rank): each batch is split "
                       "across them by tokens, gradients all-reduced, AdamW's state sharded "
                       "(docs/scaling.md)")
    num_cpus: float = Field(1.0, gt=0, description="Ray CPUs reserved for the learner")
    num_gpus: float = Field(0.0, ge=0)
    placement: Literal["pack", "spread"] = Field(
        "pack", description="where the ranks go, through a Ray placement group: pack (as few "
        "nodes as hold them) or spread (one rank per node; needs learner.ranks nodes that "
        "can hold a rank)")


class EngineSection(EngineLimits):
    """Each rollout worker's engine: the engine's own limits (parity.engine.config), its KV
    pool sized by the run. Left empty, the context and the KV pool are sized from the
    episodes: `max_model_len` is the episode token limit (`env.kwargs.limits.max_tokens`,
    else EpisodeLimits' default) capped at the model's max_position_embeddings, and the pool
    holds every episode a worker runs at once (rollout.group_size x
    rollout.max_groups_in_flight, at most max_seqs) at that length."""

    kv_blocks: int | None = Field(None, ge=1, description="KV-cache blocks of block_size "
                                  "tokens; empty: sized from the episodes (or kv_memory_gib)")
    kv_memory_gib: float | None = Field(None, gt=0, description="size the KV pool by memory "
                                        "instead (GiB, converted with the model's layers, KV "
                                        "heads, head dim and dtype)")

    @model_validator(mode="after")
    def _one_size(self) -> EngineSection:
        if self.kv_blocks is not None and self.kv_memory_gib is not None:
            raise ValueError("set kv_blocks or kv_memory_gib, not both")
        return self

    def sized(self, episode_tokens: int, episodes: int, max_positions: int,
              kv_bytes_per_token: int) -> EngineSection:
        """This section with max_model_len and kv_blocks resolved for a model whose positions
        end at `max_positions` and whose K/V take `kv_bytes_per_token`; ValueError naming
        the field when the pool cannot hold one sequence of max_model_len tokens."""
        max_len = self.max_model_len or min(episode_tokens, max_positions)
        per_seq = -(-max_len // self.block_size)
        blocks, field = self.kv_blocks, "kv_blocks"
        if self.kv_memory_gib is not None:
            blocks, field = int(self.kv_memory_gib * 2**30) // (kv_bytes_per_token * self.block_size), "kv_memory_gib"
        if blocks is None:
            blocks = per_seq * min(episodes, self.max_seqs)
        if blocks < per_seq:
            raise ValueError(f"engine.{field}: the KV pool holds {blocks * self.block_size} tokens, "
                             f"fewer than one episode of {max_len} (engine.max_model_len, else "
                             f"env.kwargs.limits.max_tokens)")
        return self.model_copy(update={"kv_blocks": blocks, "kv_memory_gib": None, "max_model_len": max_len})


class LossSection(StrictModel):
    is_mode: Literal["token", "tis", "icepop", "none"] = Field(
        "token", description="token: untruncated token-level IS (REINFORCE Zero); tis: "
                             "truncate at tis_c; icepop: mask tokens with w outside "
                             "[icepop_lo, icepop_hi]; none: w = 1")
    tis_c: float = Field(2.0, gt=0)
    icepop_lo: float = Field(0.5, gt=0)
    icepop_hi: float = Field(2.0, gt=0)
    gate_kl: float | None = Field(None, gt=0, description="sequence gate δ: drop a sequence "
                                                         "whose mean per-token KL (D3) > δ")
    advantage: Literal["mean", "mean_std"] = Field("mean", description="mean: R − group mean "
                                                   "(REINFORCE Zero); mean_std: GRPO")
    std_eps: float = Field(1e-6, gt=0)
    vcpo_lr: Literal["off", "linear", "sqrt"] = Field("off", description="ESS-scaled LR: "
                                                      "η0·ESS/N (linear) or η0·sqrt(ESS/N)")
    vcpo_baseline: bool = Field(False, description="baseline b* = Σρ_i R_i / Σρ_i per group")

    @model_validator(mode="after")
    def _band(self) -> LossSection:
        if self.icepop_lo >= self.icepop_hi:
            raise ValueError(f"icepop_lo ({self.icepop_lo}) must be < icepop_hi ({self.icepop_hi})")
        return self


class OptimSection(StrictModel):
    lr: float = Field(2e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam's β1, β2")
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, gt=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    micro_batch_tokens: int = Field(8192, ge=1, description="gradient accumulation: real "
                                    "tokens per micro-batch (one sequence always fits)")
    max_update_kl: float | None = Field(None, ge=0, description="a trust region on each "
                                        "update: when it moved the policy by more than this "
                                        "(k2 KL on a sample of its own batch, "
                                        "update_kl_share), the step and Adam's momentum are "
                                        "shrunk towards the weights before it, by "
                                        "√(bound / KL) first, measured again after each "
                                        "shrink (up to 4) until the sample is within the "
                                        "bound. Unset: 0.1 in async, where a step "
                                        "trains on data sampled before the last updates and "
                                        "cannot see what they did (docs/benchmarks-async.md), "
                                        "off in sync; 0: off. Costs a copy of the weights "
                                        "and a forward of the sample per update (one more "
                                        "per shrink)")
    update_kl_share: float = Field(0.125, gt=0, le=1, description="share of the batch's "
                                   "sequences that max_update_kl measures the update on")
    chunk_tokens: int | None = Field(None, ge=1, description="long episodes: run each "
                                     "sequence's forward in chunks of this many tokens "
                                     "(bounded memory, the same per-token logprobs)")


class TrainSection(StrictModel):
    steps: int = Field(40, ge=1, description="learner updates")
    mode: Literal["async", "sync"] = Field("async", description="sync = max_lag 0")
    max_lag: int = Field(2, ge=0, description="max policy versions between sampling and use")
    seed: int = 0
    checkpoint_every: int = Field(5, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    track_mismatch: bool = Field(True, description="recompute logprobs under the rollout's "
                                 "version to split D3 into mismatch and lag")
    mismatch_share: float = Field(0.25, gt=0, le=1, description="share of the sequences "
                                  "with tokens of older versions that the D3 split recomputes "
                                  "under those versions (one extra forward each; is/d3_share "
                                  "reports it); 1: all. is/d3_mismatch is measured on the "
                                  "sample (docs/training.md §1)")
    track_update_kl: bool = Field(False, description="after each update, one more forward "
                                  "of its batch under the new weights: kl/update, how far the "
                                  "update moved the policy on the tokens it trained on")
    ray_address: str = Field("", description="empty: start a local Ray; else a cluster address")
    max_steps_without_signal: int = Field(10, ge=1, description="stop the run when this "
                                          "many steps in a row had no learning signal: in "
                                          "every group all episodes scored the same, so "
                                          "every advantage was 0")
    max_dropped_in_a_row: int = Field(8, ge=1, description="stop the run when this many "
                                      "groups in a row are dropped (their episode code raised)")
    max_env_failure_frac: float = Field(0.5, ge=0, le=1, description="stop the run when more "
                                        "of a step's episodes failed outside the agent (a "
                                        "sandbox that did not start or died, an env bug, a "
                                        "timeout): the env cannot run properly here")
    min_group_episodes: int = Field(2, ge=2, description="a group some of whose episodes "
                                    "failed outside the agent trains on the others when at "
                                    "least this many remain, their group-mean advantage "
                                    "taken over them alone; else it is dropped (counted in "
                                    "count/dropped). Failed episodes never train: their "
                                    "reward is not the policy's (docs/training.md §2)")
    max_learner_restarts: int = Field(2, ge=0, description="restarts of a dead learner actor "
                                      "from the last checkpoint, within the run")
    start_timeout_s: float = Field(300.0, gt=0, description="the learner and each rollout "
                                   "worker must be placed and constructed within this; else "
                                   "the run stops, naming the placement keys")
    sync_timeout_s: float = Field(300.0, gt=0, description="a weight publish, or a worker's "
                                  "acknowledgement of new weights (counted from its last "
                                  "finished group), that takes longer is a hang: the learner "
                                  "or the worker is restarted")
    node_mismatch: Literal["error", "warn"] = Field(
        "error", description="when the learner's and a rollout worker's nodes compute aligned "
        "kernels' bits differently: error (refuse to start) or warn (train; is/d3_mismatch "
        "measures it)")


class EvalSection(StrictModel):
    heldout_episodes: int = Field(256, ge=0, description="held-out episodes run before and "
                                  "after training (0: skip). One standard error of a pass "
                                  "rate near 45% is 3.1 points at 256 episodes, 6.2 at 64: "
                                  "fewer cannot judge a ±3-point difference "
                                  "(docs/benchmarks-async.md)")


class OutputSection(StrictModel):
    tensorboard: bool = True
    plots: bool = True
    progress: bool = True
    samples_per_step: int = Field(4, ge=0, description="whole episodes of each step's batch "
                                  "written to samples.jsonl and TensorBoard's text tab (text, "
                                  "reward and its parts, tool calls, parse errors, the "
                                  "expected answer): one per group, the first groups first")


class TrainConfig(StrictModel):
    model: ModelSection = Field(default_factory=ModelSection)
    env: EnvSection = Field(default_factory=EnvSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    learner: LearnerSection = Field(default_factory=LearnerSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    vllm: VllmOptions = Field(default_factory=VllmOptions, description="vLLM rollout workers "
                              "(rollout.engine = \"vllm\" or \"vllm-aligned\"); their context is "
                              "the [engine] section's max_model_len, sized the same way")
    loss: LossSection = Field(default_factory=LossSection)
    optim: OptimSection = Field(default_factory=OptimSection)
    train: TrainSection = Field(default_factory=TrainSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    output: OutputSection = Field(default_factory=OutputSection)

    @property
    def max_lag(self) -> int:
        """The effective staleness bound (0 in sync mode)."""
        return 0 if self.train.mode == "sync" else self.train.max_lag

    @property
    def max_update_kl(self) -> float:
        """The trust region's bound in effect: optim.max_update_kl, unset: 0.1 when updates
        may lag (async), 0 (off) when they do not. Resolved here at use, not stored: a saved
        config keeps it unset, so a run resumed in the other mode gets that mode's bound."""
        if self.optim.max_update_kl is not None:
            return self.optim.max_update_kl
        return 0.1 if self.max_lag else 0.0

    @property
    def episodes_in_flight(self) -> int:
        """Episodes one rollout worker runs at once (each a sequence in its engine)."""
        return self.rollout.group_size * self.rollout.max_groups_in_flight

    @property
    def episode_tokens(self) -> int:
        """The episode token limit as the config states it: `env.kwargs.limits.max_tokens`,
        else EpisodeLimits'. An env's own longer default is read from the env itself when the
        engine is sized (`backends.episode_tokens`)."""
        from parity.envs.episode import EpisodeLimits  # the tokenizer: loaded only when asked

        return int((self.env.kwargs.get("limits") or {}).get("max_tokens", EpisodeLimits.max_tokens))

    @model_validator(mode="after")
    def _mismatch_measured(self) -> TrainConfig:
        if self.rollout.engine == "vllm" and not self.train.track_mismatch:
            raise ValueError("rollout.engine = \"vllm\" needs train.track_mismatch = true: vLLM's "
                             "logprobs are not the learner's, and is/d3_mismatch must show by "
                             "how much")
        if self.rollout.engine == "vllm-aligned" and self.model.kernels != "aligned":
            raise ValueError("rollout.engine = \"vllm-aligned\" runs parity's aligned kernels "
                             "inside vLLM: it needs model.kernels = \"aligned\"")
        return self

    @model_validator(mode="after")
    def _kv_holds_an_episode(self) -> TrainConfig:
        # An explicit pool is checked here, against the episode as long as the config says
        # (the model's positions can only shorten it); kv_memory_gib needs the model's shapes
        # and is checked with the model, before any actor starts (backends.check_model).
        if self.engine.kv_memory_gib is None:
            self.engine.sized(self.episode_tokens, self.episodes_in_flight,
                              max_positions=self.episode_tokens, kv_bytes_per_token=0)
        return self


def load_train_config(path: str | Path | None = None, overrides: list[str] | None = None
                      ) -> TrainConfig:
    """Load and validate; raises `ConfigError` naming the file and the bad key."""
    return load_config(TrainConfig, path, overrides)
