"""`learner.ranks = 2` on Ray: two learner rank actors in one gloo group train the tiny
job with no mismatch, restart from the checkpoint when a rank dies, profile each rank
(waiting on collectives as its own state), write a sharded checkpoint, and a single learner
resumes it."""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import ray
import tiny
import torch
import torch.distributed as dist
from test_orchestrator import _cfg

from parity.core.timing import COLLECTIVE, FORWARD
from parity.trainer.errors import cause
from parity.trainer.learner_actor import ModelIO
from parity.trainer.profile import profile_run
from parity.trainer.rundir import read_metrics
from parity.trainer.train import run_training

ray.cloudpickle.register_pickle_by_value(tiny)  # Ray workers cannot import test modules
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _failing_logprobs(when: str, how: str, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The tiny model's logprobs; rank 1, in its first forward after the path `when`
    exists, once: dies ("die"), hangs ("hang") or raises an error of its own ("raise")."""
    if dist.get_rank() == 1 and os.path.exists(when) and not os.path.exists(when + ".done"):
        Path(when + ".done").touch()
        if how == "die":
            os._exit(1)
        if how == "hang":
            time.sleep(600)
        raise ValueError("rank 1's own error")
    return tiny.packed_logprobs(*args, **kwargs)


def _dying_save(when: str, model: torch.nn.Module, model_dir: Path) -> None:
    """The tiny model's save; rank 0 dies in the first checkpoint write after `when` exists."""
    if os.path.exists(when) and not os.path.exists(when + ".done"):
        Path(when + ".done").touch()
        os._exit(1)
    tiny.save_tiny(model, model_dir)


def _train(cfg: Any, run: Path, resume: bool = False, fail: tuple[Path, str] | None = None) -> dict:
    logprobs = functools.partial(_failing_logprobs, str(fail[0]), fail[1]) \
        if fail and fail[1] != "die saving" else tiny.packed_logprobs
    save = functools.partial(_dying_save, str(fail[0])) if fail and fail[1] == "die saving" \
        else tiny.save_tiny
    io = ModelIO(load=tiny.load_tiny, save=save, logprobs=logprobs)
    return run_training(cfg, run, resume=resume, io=io, backend_factory=tiny.TinyBackend,
                        episode_factory=tiny.tiny_episodes)


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_two_ranks_train_without_mismatch_survive_a_dead_rank_and_resume_as_one(
        ray_local, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Rank 1 dies in its first forward after step 1's checkpoint is written: the group is
    killed and restarts from that checkpoint (a 2-rank one, restored into 2 new ranks);
    every version is logged once; no step has any mismatch; a single learner resumes the
    2-rank checkpoint."""
    run = tmp_path / "run"
    first = run / "checkpoints" / "step_000001"
    summary = _train(_cfg(tmp_path, learner={"ranks": 2}, rollout={"workers": 1},
                          train={"steps": 3, "checkpoint_every": 1, "mismatch_share": 1.0,
                                 "sync_timeout_s": 30}), run, fail=(first, "die"))
    assert Path(f"{first}.done").exists() and summary["learner_restarts"] == 1
    restarted = [ln for ln in capfd.readouterr().err.splitlines() if "restarting the run" in ln]
    assert len(restarted) == 1 and "restarting the run from step_00000" in restarted[0], restarted
    assert "from step_000000" not in restarted[0]  # a checkpoint of step 1 or later
    recs = read_metrics(run)
    assert [r["version"] for r in recs] == [1, 2, 3]
    assert all(r["is/d3_mismatch"] == 0.0 for r in recs)
    rep = profile_run(run)
    for track in ("learner", "learner rank 1"):
        assert {FORWARD, COLLECTIVE} <= set(rep["states"][track]["seconds"]), track
    shards = run / "checkpoints" / "step_000003" / "optimizer"  # AdamW's, a file per rank
    assert sorted(f.name for f in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]

    _train(_cfg(tmp_path, rollout={"workers": 1}, train={"steps": 4, "mismatch_share": 1.0}),
           run, resume=True)
    recs = read_metrics(run)
    assert [r["version"] for r in recs] == [1, 2, 3, 4]
    assert recs[-1]["is/d3_mismatch"] == 0.0


def test_a_rank_that_hangs_restarts_the_group_after_the_sync_timeout(
        ray_local, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Rank 1 hangs in its first forward: rank 0's collective times out after
    train.sync_timeout_s, every rank is killed and the run restarts and completes."""
    marker = tmp_path / "hang"
    marker.touch()
    run = tmp_path / "run"
    summary = _train(_cfg(tmp_path, learner={"ranks": 2}, rollout={"workers": 1},
                          train={"steps": 2, "checkpoint_every": 1, "sync_timeout_s": 5}),
                     run, fail=(marker, "hang"))
    assert summary["learner_restarts"] == 1
    restarted = [ln for ln in capfd.readouterr().err.splitlines() if "restarting the run" in ln]
    assert len(restarted) == 1 and "a learner rank failed: RuntimeError:" in restarted[0]
    assert "Timed out waiting 5000ms" in restarted[0], restarted
    assert [r["version"] for r in read_metrics(run)] == [1, 2]


def test_a_ranks_own_error_stops_the_run_in_one_line_without_a_restart(
        ray_local, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Rank 1 raises an error of its own (a bug, a full disk): the run stops with it, as one
    learner's would, instead of restarting into the same error; rank 0, which meanwhile
    waits on rank 1 in a collective, gives up after train.sync_timeout_s."""
    marker = tmp_path / "raise"
    marker.touch()
    with pytest.raises(ray.exceptions.RayTaskError) as stopped:
        _train(_cfg(tmp_path, learner={"ranks": 2}, rollout={"workers": 1},
                    train={"steps": 2, "checkpoint_every": 1, "sync_timeout_s": 5}),
               tmp_path / "run", fail=(marker, "raise"))
    assert cause(stopped.value) == "ValueError: rank 1's own error"
    assert "restarting the run" not in capfd.readouterr().err


def test_a_rank_that_dies_writing_a_checkpoint_leaves_the_last_one_and_restarts(
        ray_local, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Rank 0 dies writing step 2's checkpoint (the model, after every rank wrote its
    optimizer shards): no step 2 checkpoint appears, the group restarts from step 1's, and
    every version is logged once."""
    run = tmp_path / "run"
    first = run / "checkpoints" / "step_000001"
    summary = _train(_cfg(tmp_path, learner={"ranks": 2}, rollout={"workers": 1},
                          train={"steps": 3, "checkpoint_every": 1, "sync_timeout_s": 30}),
                     run, fail=(first, "die saving"))
    assert Path(f"{first}.done").exists() and summary["learner_restarts"] == 1
    restarted = [ln for ln in capfd.readouterr().err.splitlines() if "restarting the run" in ln]
    assert len(restarted) == 1 and "restarting the run from step_000001" in restarted[0], restarted
    assert [r["version"] for r in read_metrics(run)] == [1, 2, 3]
    assert not list((run / "checkpoints").glob(".step_*"))  # no partial write left behind
