"""`learner.ranks = 2` on Ray: two learner rank actors in one gloo group train the tiny
job with no mismatch, restart from the checkpoint when a rank dies, profile each rank
(waiting on collectives as its own state), write a sharded checkpoint, and a single learner
resumes it."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import ray
import tiny
import torch
import torch.distributed as dist
from test_orchestrator import _cfg

from parity.core.timing import COLLECTIVE, FORWARD
from parity.trainer.learner_actor import ModelIO
from parity.trainer.profile import profile_run
from parity.trainer.rundir import read_metrics
from parity.trainer.train import run_training

ray.cloudpickle.register_pickle_by_value(tiny)  # Ray workers cannot import test modules
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _dying_logprobs(marker: str, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The tiny model's logprobs; rank 1 dies in its first forward after `marker` appears."""
    if dist.get_rank() == 1 and os.path.exists(marker) and not os.path.exists(marker + ".done"):
        Path(marker + ".done").touch()
        os._exit(1)
    return tiny.packed_logprobs(*args, **kwargs)


def _train(cfg: Any, run: Path, resume: bool = False, marker: str | None = None) -> dict:
    logprobs = functools.partial(_dying_logprobs, marker) if marker else tiny.packed_logprobs
    io = ModelIO(load=tiny.load_tiny, save=tiny.save_tiny, logprobs=logprobs)
    return run_training(cfg, run, resume=resume, io=io, backend_factory=tiny.TinyBackend,
                        episode_factory=tiny.tiny_episodes)


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_two_ranks_train_without_mismatch_survive_a_dead_rank_and_resume_as_one(
        ray_local, tmp_path: Path) -> None:
    """Rank 1 dies in the middle of step 1: the group restarts from step 1's checkpoint;
    no step has any mismatch; a single learner resumes the 2-rank checkpoint."""
    run = tmp_path / "run"
    marker = tmp_path / "die"
    marker.touch()
    summary = _train(_cfg(tmp_path, learner={"ranks": 2}, rollout={"workers": 1},
                          train={"steps": 2, "checkpoint_every": 1, "mismatch_share": 1.0,
                                 "sync_timeout_s": 30}), run, marker=str(marker))
    assert (tmp_path / "die.done").exists() and summary["learner_restarts"] == 1
    recs = read_metrics(run)
    assert [r["version"] for r in recs] == [1, 2]
    assert all(r["is/d3_mismatch"] == 0.0 for r in recs)
    rep = profile_run(run)
    for track in ("learner", "learner rank 1"):
        assert {FORWARD, COLLECTIVE} <= set(rep["states"][track]["seconds"]), track
    shards = run / "checkpoints" / "step_000002" / "optimizer"  # AdamW's, a file per rank
    assert sorted(f.name for f in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]

    _train(_cfg(tmp_path, rollout={"workers": 1}, train={"steps": 3, "mismatch_share": 1.0}),
           run, resume=True)
    recs = read_metrics(run)
    assert [r["version"] for r in recs] == [1, 2, 3]
    assert recs[-1]["is/d3_mismatch"] == 0.0
