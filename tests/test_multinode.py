"""Multi-node training on a real two-node Ray cluster on this machine: the learner on the head
(custom resource `learner`), the rollout worker with its env and sandboxes on the other node
(`rollout`), weights crossing nodes through the object store. And what a cluster does wrong:
a placement it cannot hold, resources it has but that are taken, a node lost mid-run, a
weight sync that hangs — each a clear error or a restart within a timeout."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # as `parity train` does
ray = pytest.importorskip("ray")

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    ray.shutdown()
    # a lost node is noticed within about a second, not Ray's default 15 s
    fast = {"health_check_period_ms": 300, "health_check_failure_threshold": 3}
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"learner": 1}, "include_dashboard": False,
        "_system_config": fast})
    c.rollout_node = c.add_node(num_cpus=1, resources={"rollout": 1})
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def _node_with(resource: str) -> str:
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"])


def _cfg(address: str, steps: int = 3, **over: Any):
    """The embedded default, shrunk: one group of 2 episodes per step, async max_lag 1."""
    from parity.trainer.config import TrainConfig

    raw: dict[str, Any] = {
        "learner": {"resources": {"learner": 1}},
        "rollout": {"workers": 1, "resources": {"rollout": 1}, "group_size": 2,
                    "groups_per_step": 1, "max_groups_in_flight": 1, "max_new_tokens": 24},
        "train": {"steps": steps, "max_lag": 1, "checkpoint_every": steps, "ray_address": address},
        "eval": {"heldout_episodes": 0},
        "output": {"tensorboard": False, "plots": False, "progress": False},
    }
    for section, values in over.items():
        raw[section] = {**raw.get(section, {}), **values}
    return TrainConfig.model_validate(raw)


def _actor_nodes() -> dict[str, set[str]]:
    """Ray's own record (the GCS actor table) of the nodes each actor class ran on."""
    from ray._private.state import state

    out: dict[str, set[str]] = {}
    for a in state.actor_table(None).values():
        out.setdefault(a["ActorClassName"], set()).add(a["Address"]["NodeID"])
    return out


def test_learner_and_rollout_on_their_own_nodes(cluster, tmp_path):
    """Three updates at max_lag 1: the worker can start group g only once it holds version
    g - 1, so finishing proves the learner's weights reached the other node."""
    from parity.trainer.train import run_training

    summary = run_training(_cfg(cluster.address), tmp_path / "run")
    learner_node, rollout_node = _node_with("learner"), _node_with("rollout")
    assert learner_node != rollout_node
    assert summary["updates"] == 3 and summary["worker_restarts"] == 0
    assert summary["placement"]["learner"]["node_id"] == learner_node
    assert summary["placement"]["rollout worker 0"]["node_id"] == rollout_node
    seen = _actor_nodes()
    assert seen["LearnerActor"] == {learner_node} and seen["RolloutWorker"] == {rollout_node}
    # async on a 1-CPU share each: one torch thread per actor, no oversubscription
    assert summary["placement"]["learner"]["threads"] == 1
    assert summary["placement"]["rollout worker 0"]["threads"] == 1
    assert summary["lag/max/max"] <= 1


def test_a_placement_no_node_offers_fails_at_once_naming_the_key(cluster, tmp_path):
    from parity.trainer.nodes import PlacementError
    from parity.trainer.train import run_training

    t0 = time.monotonic()
    with pytest.raises(PlacementError) as e:
        run_training(_cfg(cluster.address, rollout={"resources": {"gpu_box": 1}}), tmp_path / "r")
    assert time.monotonic() - t0 < 30
    msg = str(e.value)
    assert "no alive node of the Ray cluster can hold the rollout worker" in msg
    assert "rollout.resources = {'gpu_box': 1.0}" in msg and "rollout 1" in msg


class _Squatter:
    """Another job's actor, holding the cluster's only `rollout` slot."""

    def ping(self) -> int:
        return 1


def test_resources_that_exist_but_are_taken_time_out_naming_the_worker(cluster, tmp_path):
    """The one `rollout` slot is taken: the worker can never start; it is named after
    train.start_timeout_s, not waited on for ever."""
    from parity.trainer.nodes import PlacementError
    from parity.trainer.train import run_training

    squatter = ray.remote(num_cpus=0, resources={"rollout": 1})(_Squatter).remote()
    ray.get(squatter.ping.remote())
    try:
        t0 = time.monotonic()
        with pytest.raises(PlacementError) as e:
            run_training(_cfg(cluster.address, train={"start_timeout_s": 10}), tmp_path / "r")
        assert time.monotonic() - t0 < 60
    finally:
        ray.kill(squatter)
    # on a loaded machine the learner may still be loading torch then, and is named too
    late, why = str(e.value).split(" did not start within train.start_timeout_s = 10 s.")
    assert late.startswith("placement: the ") and "rollout worker 0" in late
    assert "rollout.resources = {'rollout': 1.0}" in why


def _hang_once(marker: Path):
    """The engine, whose first weight update on a fresh machine never returns (a stuck
    transfer): the fault a real cluster shows, which a healthy process cannot produce."""

    def make(cfg):
        from parity.trainer.backends import engine_backend

        engine = engine_backend(cfg)
        if not marker.exists():
            marker.touch()
            engine.update_weights = lambda state_dict, version: time.sleep(3600)
        return engine

    return make


def test_a_hung_weight_sync_restarts_the_worker_within_the_timeout(cluster, tmp_path):
    from parity.trainer import backends
    from parity.trainer.train import run_training

    t0 = time.monotonic()
    summary = run_training(_cfg(cluster.address, train={"sync_timeout_s": 4}), tmp_path / "run",
                           backend_factory=_hang_once(tmp_path / "hung"),
                           episode_factory=backends.env_episodes)
    assert summary["updates"] == 3 and summary["worker_restarts"] == 1
    assert time.monotonic() - t0 < 120


def test_a_node_lost_mid_run_stops_with_a_clear_error(cluster, tmp_path):
    """The rollout node goes away after the first update: the worker cannot come back
    anywhere (no other node offers `doomed`), and the run says so at once (Ray knows the
    node is gone) instead of waiting for it."""
    from parity.trainer.nodes import PlacementError
    from parity.trainer.train import run_training

    doomed = cluster.add_node(num_cpus=1, resources={"doomed": 1})
    cluster.wait_for_nodes()
    run = tmp_path / "run"
    cfg = _cfg(cluster.address, steps=30, rollout={"resources": {"doomed": 1}},
               train={"start_timeout_s": 300})
    removed: list[float] = []

    def kill_after_first_step() -> None:
        while not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text():
            time.sleep(0.1)
        removed.append(time.monotonic())
        cluster.remove_node(doomed)

    killer = threading.Thread(target=kill_after_first_step, daemon=True)
    killer.start()
    with pytest.raises(PlacementError) as e:
        run_training(cfg, run)
    assert removed and time.monotonic() - removed[0] < 30  # not start_timeout_s
    assert str(e.value).startswith("placement: no alive node of the Ray cluster can hold the "
                                   "rollout worker") and "doomed" in str(e.value)
    killer.join(timeout=5)
