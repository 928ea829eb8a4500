"""`learner.placement`: a placement of the learner ranks that the Ray cluster cannot hold stops
the run at once with one line naming the keys; one whose resources other actors hold stops
it after train.start_timeout_s, its placement group removed. Ranks on two real nodes:
tests/test_learner_two_nodes.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import ray
import tiny

from parity.trainer.config import TrainConfig
from parity.trainer.learner_actor import ModelIO
from parity.trainer.learner_group import LearnerGroup, too_few_nodes
from parity.trainer.nodes import PlacementError

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests
IO = ModelIO(load=tiny.load_tiny, save=tiny.save_tiny, logprobs=tiny.packed_logprobs)


@pytest.fixture(scope="module")
def ray_one_node():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


class _Holder:
    """An actor of another job, holding a CPU the ranks would need."""


def _group(tmp_path: Path, **learner: Any) -> LearnerGroup:
    cfg = TrainConfig.model_validate({"learner": learner, "train": {"start_timeout_s": 1}})
    return LearnerGroup(cfg, IO, str(tmp_path), str(tmp_path))


def test_spread_needs_a_node_per_rank() -> None:
    cfg = TrainConfig.model_validate({"learner": {"ranks": 3, "placement": "spread"}})
    nodes = [{"Alive": True, "Resources": {"CPU": 4.0}}, {"Alive": True, "Resources": {"CPU": 1.0}},
             {"Alive": False, "Resources": {"CPU": 8.0}}]
    assert too_few_nodes(cfg, nodes) == (
        "placement: the Ray cluster can hold 2 of the learner.ranks = 3 learner ranks one per "
        "node (learner.placement = \"spread\"), each of which needs {'CPU': 1.0} "
        "(learner.num_cpus = 1, learner.num_gpus = 0, learner.resources = {}). Lower "
        "learner.ranks or those keys, set learner.placement = \"pack\", or add nodes.")
    assert too_few_nodes(cfg.model_copy(update={"learner": cfg.learner.model_copy(
        update={"placement": "pack"})}), nodes) is None  # 4 + 1 slots
    nodes[2]["Alive"] = True
    assert too_few_nodes(cfg, nodes) is None


def test_a_placement_the_cluster_cannot_hold_fails_at_once(ray_one_node, tmp_path: Path
                                                           ) -> None:
    with pytest.raises(PlacementError) as spread:
        _group(tmp_path, ranks=3, placement="spread")
    assert str(spread.value) == (
        "placement: the Ray cluster can hold 1 of the learner.ranks = 3 learner ranks one per "
        "node (learner.placement = \"spread\"), each of which needs {'CPU': 1.0} "
        "(learner.num_cpus = 1, learner.num_gpus = 0, learner.resources = {}). Lower "
        "learner.ranks or those keys, set learner.placement = \"pack\", or add nodes.")
    with pytest.raises(PlacementError) as big:
        _group(tmp_path, ranks=2, num_cpus=3)
    assert str(big.value) == (
        "placement: the Ray cluster can hold 0 of the learner.ranks = 2 learner ranks, each of "
        "which needs {'CPU': 3.0} (learner.num_cpus = 3, learner.num_gpus = 0, "
        "learner.resources = {}). Lower learner.ranks or those keys, or add nodes.")
    assert ray.util.placement_group_table() == {}  # nothing was reserved


def test_taken_resources_fail_after_the_start_timeout_and_free_the_reservation(
        ray_one_node, tmp_path: Path) -> None:
    holder = ray.remote(num_cpus=1)(_Holder).remote()
    ray.get(holder.__ray_ready__.remote())
    try:
        with pytest.raises(PlacementError) as taken:
            _group(tmp_path, ranks=2)
    finally:
        ray.kill(holder)
    assert str(taken.value) == (
        "placement: the learner.ranks = 2 learner ranks (learner.placement = \"pack\") were "
        "not placed within train.start_timeout_s = 1 s. The cluster could hold them, but other "
        "actors hold its resources (learner.num_cpus = 1, learner.num_gpus = 0, "
        "learner.resources = {}). Free or add resources, change those keys, or raise "
        "train.start_timeout_s.")
    assert [g["state"] for g in ray.util.placement_group_table().values()] == ["REMOVED"]
