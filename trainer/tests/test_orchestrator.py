"""Real Ray runs of the orchestrator on the tiny model: versions, lag bound, D3 split,
sync mode, run-dir outputs, profile, worker restart and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
import tiny
import torch

from parity.core.timing import (
    BACKWARD,
    CHECKPOINTING,
    D3_SPLIT,
    DECODE,
    ENV_WAIT,
    FORWARD,
    LEARNER_OTHER,
    LOADING,
    OPTIMIZER,
    PUBLISHING,
    UNRECORDED,
    WAITING,
    read_spans,
)
from parity.trainer.config import TrainConfig
from parity.trainer.errors import RunStopped
from parity.trainer.learner_actor import ModelIO
from parity.trainer.profile import profile_run
from parity.trainer.rundir import read_metrics
from parity.trainer.train import run_training

ray.cloudpickle.register_pickle_by_value(tiny)  # Ray workers cannot import test modules


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(tmp: Path, **sections) -> TrainConfig:
    model_dir = tmp / "init"
    if not model_dir.exists():
        tiny.save_tiny(tiny.TinyLM(), model_dir)
    base = {
        "model": {"path": str(model_dir)},
        "rollout": {"workers": 2, "num_cpus_per_worker": 1, "group_size": 2,
                    "groups_per_step": 2, "max_groups_in_flight": 2},
        "optim": {"lr": 0.05},
        "train": {"steps": 4, "max_lag": 2, "checkpoint_every": 2},
        "output": {"tensorboard": False, "plots": True, "progress": False},
        # held-out episodes would run the fake env in this process (its crash marker too)
        "eval": {"heldout_episodes": 0},
    }
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    return TrainConfig.model_validate(base)


def _train(cfg: TrainConfig, run: Path, resume: bool = False) -> dict:
    io = ModelIO(load=tiny.load_tiny, save=tiny.save_tiny, logprobs=tiny.packed_logprobs)
    return run_training(cfg, run, resume=resume, io=io, backend_factory=tiny.TinyBackend,
                        episode_factory=tiny.tiny_episodes)


def assert_states_close_the_budget(rep: dict, recs: list[dict], run: Path) -> None:
    """Each actor's exclusive states add up to each step's wall, and leave no gap while the
    actor runs: what no state covers is step time before its first state span or after its
    last one (the tail after the last drain), exactly."""
    walls = {r["step"]: r["timing/step_s"] for r in recs}
    spans = read_spans(run / "spans.jsonl")
    windows = [(s.start, s.end) for s in spans if s.cat == "step"]
    for track, st in rep["states"].items():
        assert sorted(st["per_step"]) == sorted(walls), track
        for step, states in st["per_step"].items():
            assert sum(states.values()) == pytest.approx(walls[step], rel=1e-6), (track, step)
        own = [s for s in spans if s.cat == "state" and s.track == track]
        first, last = min(s.start for s in own), max(s.end for s in own)
        outside = sum(max(0.0, min(w1, first) - w0) + max(0.0, w1 - max(w0, last)) for w0, w1 in windows)
        unrecorded = sum(states.get(UNRECORDED, 0.0) for states in st["per_step"].values())
        assert unrecorded == pytest.approx(outside, rel=1e-6, abs=1e-9), (track, st["per_step"])


def test_async_run_versions_lag_and_aligned_split(ray_local, tmp_path: Path) -> None:
    # every sequence split, so that is/d3 is all lag (the default samples a quarter)
    cfg = _cfg(tmp_path, rollout={"in_flight_updates": True}, train={"mismatch_share": 1.0})
    summary = _train(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [0, 1, 2, 3]
    assert [r["version"] for r in recs] == [1, 2, 3, 4]
    assert all(r["lag/max"] <= 2 for r in recs)
    assert recs[0]["lag/max"] == 0.0  # nothing older than version 0 exists
    assert all(r["is/d3_mismatch"] == 0.0 for r in recs)  # aligned: only lag remains
    assert all(r["is/d3"] == r["is/d3_lag"] for r in recs)
    for key in ("reward/mean", "is/ess_frac", "kl/rollout_learner", "grad/norm", "lr",
                "timing/step_s", "timing/gen_s", "timing/learner_s", "timing/sync_s",
                "timing/learner_wait_s", "timing/rollout_idle_frac",
                "throughput/tokens_per_s", "gate/rejected_frac", "is/w_peak_over_median"):
        assert key in recs[-1], key
    assert all(r["timing/learner_s"] > 0 for r in recs)
    assert sum(r["timing/gen_s"] for r in recs) > 0  # counted in the step it arrived in
    assert summary["steps"] == 4 and summary["dropped"] == 0
    run = tmp_path / "run"
    for name in ("config.toml", "summary.json", "trace.json", "plots/reward.png",
                 "plots/is.png", "plots/timing.png", "checkpoints/latest"):
        assert (run / name).exists(), name
    trace = json.loads((run / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert {"learner", "rollout-0", "rollout-1"} <= names
    rep = profile_run(run)
    assert rep["steps"] == 4 and "gen" in rep["actor_seconds"] and rep["slowest_turns"]
    assert set(rep["states"]) == {"learner", "rollout-0", "rollout-1"}
    assert_states_close_the_budget(rep, recs, run)
    learner = set(rep["states"]["learner"]["seconds"])
    assert {FORWARD, BACKWARD, OPTIMIZER, D3_SPLIT, LEARNER_OTHER, WAITING, PUBLISHING,
            CHECKPOINTING} <= learner  # lag 2: older versions in the batch, so a D3 split
    for w in ("rollout-0", "rollout-1"):
        assert {DECODE, ENV_WAIT, LOADING} <= set(rep["states"][w]["seconds"])


def test_standard_kernels_sync_mode_and_a_dropped_group(ray_local, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, model={"kernels": "standard"}, rollout={"workers": 1},
               train={"steps": 2, "mode": "sync"}, env={"kwargs": {"raise_on_task": 1}})
    summary = _train(cfg, tmp_path / "run")
    assert summary["dropped"] == 1  # group 1's episodes raised; group 4 took its place
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [0, 1]
    assert all(r["lag/max"] == 0.0 for r in recs)
    assert all(r["is/d3_mismatch"] > 0 for r in recs)
    assert all(r["is/d3_lag"] == 0.0 for r in recs)


def test_failed_episodes_train_on_the_rest_drop_their_group_and_are_counted(
        ray_local, tmp_path: Path) -> None:
    """Task 1 loses one of its 3 episodes (its group trains on 2); task 2 loses 2 (1 left,
    fewer than train.min_group_episodes = 2: dropped, group 4 takes its place). Each step
    counts the episodes of every group it consumed, trained on or dropped."""
    fail = {"1": ["sandbox"], "2": ["sandbox", "timeout"]}
    cfg = _cfg(tmp_path, rollout={"workers": 1, "group_size": 3}, env={"kwargs": {"fail": fail}},
               train={"steps": 2, "checkpoint_every": 2}, output={"samples_per_step": 10})
    summary = _train(cfg, tmp_path / "run")
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    # what each step trained on (samples show all of it here): 3 + 2 episodes, then 3 + 3
    assert [sum(s["step"] == step for s in samples) for step in (0, 1)] == [5, 6]
    recs = read_metrics(tmp_path / "run")
    got = [{k: v for k, v in r.items() if k.startswith("env/")} for r in recs]
    assert got == [
        {"env/failure_frac": 1 / 6, "env/failures/total": 1, "env/failures/sandbox": 1},
        {"env/failure_frac": 2 / 9, "env/failures/total": 2, "env/failures/sandbox": 1,
         "env/failures/timeout": 1}]
    # when group 2 is dropped depends on how the rollouts interleave; by step 1 it has been
    assert recs[-1]["count/dropped"] == 1
    assert (summary["dropped"], summary["env/failures/total"], summary["env/failures/sandbox"],
            summary["env/failures/timeout"]) == (1, 3, 2, 1)
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["env/failures/total"] == 3


def test_a_run_without_learning_signal_stops_saying_so(ray_local, tmp_path: Path) -> None:
    """Every episode scores 0.5: every group-mean advantage is 0 at every step, and the run
    stops at the limit instead of running on and exiting 0 (a run that learns nothing)."""
    cfg = _cfg(tmp_path, rollout={"workers": 1}, env={"kwargs": {"constant_reward": 0.5}},
               train={"steps": 6, "max_steps_without_signal": 3})
    with pytest.raises(RunStopped) as e:
        _train(cfg, tmp_path / "run")
    assert str(e.value) == (
        "no learning signal for 3 steps in a row, up to step 2 (train.max_steps_without_signal "
        "= 3): in every group all 2 episodes scored the same (mean reward 0.500), so every "
        "advantage was 0; the tasks are out of this model's reach, or too easy for it")
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [0, 1]


@pytest.mark.slow
def test_worker_crash_then_resume_loses_and_repeats_nothing(ray_local, tmp_path: Path) -> None:
    """A rollout worker dies mid-run (restarted, its groups re-run); later the trainer
    "dies" after an uncheckpointed step; resuming redoes exactly that step."""
    run = tmp_path / "run"
    marker = tmp_path / "crashed"
    one = {"workers": 1}
    summary = _train(_cfg(tmp_path, rollout=one, env={"kwargs": {"crash_marker": str(marker)}},
                          train={"steps": 2, "checkpoint_every": 2}), run)
    assert marker.exists() and summary["worker_restarts"] == 1
    ckpt_state = torch.load(run / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    assert ckpt_state["version"] == 2
    # metrics of a step 2 that was lost with the process (no checkpoint after it)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 2, "reward/mean": -1.0}) + "\n")
    _train(_cfg(tmp_path, rollout=one, train={"steps": 4, "checkpoint_every": 2}), run,
           resume=True)
    recs = read_metrics(run)
    assert [r["step"] for r in recs] == [0, 1, 2, 3]
    assert recs[2]["reward/mean"] != -1.0
    assert [r["version"] for r in recs] == [1, 2, 3, 4]
    assert recs[-1]["count/worker_restarts"] == 1  # counters survive the resume
    assert all(s.step < 4 for s in read_spans(run / "spans.jsonl"))


def _tb_steps(run: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def test_resume_forgets_abandoned_steps_everywhere_and_names_the_wall(ray_local,
                                                                      tmp_path: Path) -> None:
    """A process that logged steps 2 and 3 died before checkpointing them: the resume
    redoes them, and TensorBoard shows each step once. A resume of the finished run does
    nothing (no new segment). The wall's parts add up to it."""
    from torch.utils.tensorboard import SummaryWriter

    from parity.trainer.train import RunFinished

    run = tmp_path / "run"
    cfg = _cfg(tmp_path, rollout={"workers": 1}, train={"steps": 2, "checkpoint_every": 2},
               output={"tensorboard": True, "samples_per_step": 3})
    _train(cfg, run)
    assert _tb_steps(run, "reward/mean") == [0, 1]
    lost = SummaryWriter(str(run / "tb"))  # what the dead process had logged
    for step in (2, 3):
        lost.add_scalar("reward/mean", -1.0, step)
    lost.close()
    cfg4 = _cfg(tmp_path, rollout={"workers": 1}, train={"steps": 4, "checkpoint_every": 2},
                output={"tensorboard": True, "samples_per_step": 3})
    summary = _train(cfg4, run, resume=True)
    assert _tb_steps(run, "reward/mean") == [0, 1, 2, 3]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert {"reward", "reward_components", "messages", "expected", "tool_calls"} <= set(samples[0])
    assert summary["segments"] == 2
    parts = summary["startup_s"] + summary["steps_s"] + summary["heldout_s"]
    assert parts == pytest.approx(summary["wall_s"], rel=1e-9)
    assert summary["steps_s"] == pytest.approx(sum(r["timing/step_s"] for r in read_metrics(run)),
                                               rel=1e-9)
    segments = (run / "segments.json").read_text()
    with pytest.raises(RunFinished) as e:
        _train(cfg4, run, resume=True)
    assert str(e.value) == (f"{run} has trained all its 4 steps (train.steps = 4); to train on: "
                            f"parity train --resume {run} --set train.steps=N with N > 4")
    assert (run / "segments.json").read_text() == segments
