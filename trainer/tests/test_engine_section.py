"""The `[engine]` section: validation that names the field, and defaults sized so that one
episode of the episode token limit fits the KV pool."""

from __future__ import annotations

import pytest
import torch

from parity.core.config import ConfigError
from parity.engine.kv_cache import KVPool
from parity.model.shapes import TINY
from parity.trainer.backends import engine_backend, engine_config
from parity.trainer.config import load_train_config

# the embedded shape (4 layers x 2 KV heads x 64 dims, K and V, float32: 4096 bytes per
# token slot) with room for 128K positions
MODEL = TINY.model_copy(update={"max_position_embeddings": 131072})


def test_bad_values_name_the_field() -> None:
    with pytest.raises(
        ConfigError, match=r"engine.block_size: Input should be 1, 2, 4, 8, 16, 32 or 64"
    ):
        load_train_config(None, ["engine.block_size=12"])
    with pytest.raises(
        ConfigError, match=r"engine.max_batch_tokens: Input should be greater than or equal to 1"
    ):
        load_train_config(None, ["engine.max_batch_tokens=0"])
    with pytest.raises(ConfigError, match=r"engine.prefix_cache: unknown key"):
        load_train_config(None, ["engine.prefix_cache=false"])
    with pytest.raises(ConfigError, match=r"engine: .*set kv_blocks or kv_memory_gib, not both"):
        load_train_config(None, ["engine.kv_blocks=4096", "engine.kv_memory_gib=1.0"])


def test_a_pool_that_cannot_hold_one_episode_is_refused() -> None:
    # the default episode limit (EpisodeLimits.max_tokens = 16384) needs 1024 blocks of 16
    with pytest.raises(
        ConfigError,
        match=r"engine.kv_blocks: the KV pool holds 16368 tokens, "
        r"fewer than one episode of 16384",
    ):
        load_train_config(None, ["engine.kv_blocks=1023"])
    assert load_train_config(None, ["engine.kv_blocks=1024"]).engine.kv_blocks == 1024
    # a shorter episode (env limits, or max_model_len) fits a smaller pool
    short = '{ difficulty = 0, kinds = ["mul"], backend = "local", limits = { max_tokens = 2048 } }'
    assert (
        load_train_config(None, ["engine.kv_blocks=128", f"env.kwargs={short}"]).episode_tokens
        == 2048
    )
    load_train_config(None, ["engine.kv_blocks=128", "engine.max_model_len=2048"])
    with pytest.raises(
        ConfigError,
        match=r"engine.kv_blocks: the KV pool holds 2048 tokens, fewer than one episode of 2049",
    ):
        load_train_config(None, ["engine.kv_blocks=128", "engine.max_model_len=2049"])
    # a memory budget is checked against the model's K/V size
    cfg = load_train_config(None, ["engine.kv_memory_gib=0.0625"])  # 16384 slots of 4096 bytes
    assert engine_config(cfg, MODEL, torch.float32).kv_blocks == 1024
    small = load_train_config(None, ["engine.kv_memory_gib=0.06"])
    with pytest.raises(ValueError, match=r"engine.kv_memory_gib: the KV pool holds 15728 tokens"):
        engine_config(small, MODEL, torch.float32)


def test_defaults_hold_every_episode_in_flight_at_the_episode_limit() -> None:
    cfg = load_train_config(None, ["rollout.group_size=4", "rollout.max_groups_in_flight=2"])
    assert KVPool.bytes_per_token(MODEL, torch.float32) == 4096
    ec = engine_config(cfg, MODEL, torch.float32)
    assert ec.max_model_len == 16384 and ec.kv_blocks == 8 * 16384 // 16
    assert (ec.block_size, ec.max_batch_tokens, ec.prefix_caching, ec.seed) == (16, 2048, True, 0)
    # the model's positions cap the context (and so the pool) below the episode limit
    short = engine_config(
        cfg, MODEL.model_copy(update={"max_position_embeddings": 4096}), torch.float32
    )
    assert short.max_model_len == 4096 and short.kv_blocks == 8 * 4096 // 16
    # at most max_seqs sequences run at once, so the pool holds no more
    few = engine_config(load_train_config(None, ["engine.max_seqs=3"]), MODEL, torch.float32)
    assert few.kv_blocks == 3 * 16384 // 16


def test_the_engine_backend_is_built_from_the_section() -> None:
    cfg = load_train_config(
        None,
        [
            "engine.kv_blocks=512",
            "engine.block_size=8",
            "engine.max_model_len=4000",
            "engine.prefix_caching=false",
            "train.seed=5",
        ],
    )
    eng = engine_backend(cfg)
    c = eng.config
    assert (c.kv_blocks, c.block_size, c.max_model_len, c.prefix_caching, c.seed) == (
        512,
        8,
        4000,
        False,
        5,
    )
    assert eng.max_len == 4000 and eng.runner.pool.k.shape[1:4:2] == (512, 8)


def test_an_envs_own_longer_episode_limit_sizes_the_engine() -> None:
    # DesktopText's default limit is 32768 tokens, not EpisodeLimits' 16384; no desktop starts
    cfg = load_train_config(None, ['env.id="parity/DesktopText-v0"', "env.kwargs={}"])
    assert cfg.episode_tokens == 16384
    ec = engine_config(cfg, MODEL, torch.float32)
    assert ec.max_model_len == 32768


def test_a_kv_pool_beyond_available_memory_is_refused_naming_the_keys() -> None:
    """examples/hf_checkpoint.toml's 8 GiB pool on a machine with 6 GiB free: refused before
    any actor allocates, not killed by the OS minutes in."""
    from parity.model import ModelConfig
    from parity.model.io import param_count
    from parity.trainer.backends import MemoryBudgetError, check_memory
    from parity.trainer.embedded import EMBEDDED_DIR

    params = param_count(ModelConfig.from_pretrained(EMBEDDED_DIR))
    assert params == 3_216_384  # the embedded checkpoint's tensors, a tied head once

    cfg = load_train_config(None, ["engine.kv_memory_gib=8.0", "engine.max_model_len=16384"])
    gib = 2**30
    with pytest.raises(MemoryBudgetError) as e:
        check_memory(cfg, params, 8 * gib, 4, available=6 * gib)
    assert str(e.value) == (
        "the run needs about 9.1 GiB but this machine has 6.0 GiB available: KV pools 8.0 GiB "
        "(rollout.workers = 1 x engine.kv_memory_gib / engine.kv_blocks, sized from "
        "engine.max_model_len = 16384 and the episodes in flight), dense K/V 1.0 GiB "
        "(engine.dense_kv_mib = 1024), weights, gradients and optimizer state 0.1 GiB (3M "
        "parameters); lower engine.kv_memory_gib or engine.kv_blocks, engine.max_model_len, "
        "engine.dense_kv_mib or rollout.workers")
    check_memory(cfg, params, 8 * gib, 4, available=10 * gib)  # fits: no error
