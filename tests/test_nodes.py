"""Nodes of one job must compute the same bits. A two-node Ray cluster on this machine, one node
forced onto another torch dispatch level (the kernels a CPU without AVX-512, or without AVX2,
runs): each node passes its own start-up proof, yet their bits differ, and both `parity audit
--ray-address` and `parity train` must say so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # as `parity train` does
ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from parity.core.types import SamplingParams, Trajectory  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests
OTHER = {"AVX512": "avx2", "AVX2": "default"}.get(torch.backends.cpu.get_cpu_capability())
pytestmark = pytest.mark.skipif(OTHER is None, reason="no other torch dispatch level on this CPU")


@pytest.fixture(scope="module")
def mixed_cluster():
    from ray.cluster_utils import Cluster

    ray.shutdown()
    local = {"num_cpus": 1, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=local)
    cluster.add_node(**local, env_vars={"ATEN_CPU_CAPABILITY": OTHER})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from parity.engine.shapes import random_model
    from parity.model import save_model

    d = tmp_path_factory.mktemp("model")
    save_model(random_model("test"), d)
    return d


def test_cluster_probe_finds_nodes_that_disagree(mixed_cluster):
    from parity.engine.shapes import SHAPES
    from parity.trainer.nodes import probe_cluster

    report = probe_cluster(mixed_cluster.address, {"test": SHAPES["test"]})
    probes = report["models"]["test"]["probes"]
    assert report["nodes"] == 2 and not report["agree"]
    assert all(p["proof_ok"] for p in probes)  # each node is row-invariant on its own
    assert len({p["fingerprint"] for p in probes}) == 2
    assert {p["torch_capability"] for p in probes} == {OTHER.upper(), torch.backends.cpu.get_cpu_capability()}
    msg = report["models"]["test"]["disagreement"]
    assert msg.startswith("aligned kernels give different bits on different nodes")
    assert 'train.node_mismatch = "warn"' in msg


def test_audit_cli_fails_on_a_mixed_cluster(mixed_cluster):
    out = subprocess.run(
        [str(Path(sys.executable).parent / "parity"), "audit", "--shape", "test", "--json",
         "--ray-address", mixed_cluster.address], capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["all_bitwise_equal"] and report["conclusive"]  # this machine alone is fine
    assert report["cluster"]["agree"] is False and not report["passed"]


def episodes(cfg):
    """One turn after a three-token prompt; reward: the share of odd token ids."""

    async def episode(generate, task_seed: int, sampling_seed: int) -> Trajectory:
        prompt = [3 + task_seed % 50, 7, 9]
        c = await generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=6,
                                                  seed=sampling_seed))
        n = len(c.token_ids)
        return Trajectory(group_id=str(task_seed), tokens=prompt + c.token_ids,
                          loss_mask=[0] * 3 + [1] * n, logprobs=[0.0] * 3 + c.logprobs,
                          versions=[-1] * 3 + c.versions,
                          reward=sum(t % 2 for t in c.token_ids) / max(n, 1))

    return episode


def _cfg(model_dir: Path, address: str, mismatch: str):
    from parity.trainer.config import TrainConfig

    return TrainConfig.model_validate({
        "model": {"path": str(model_dir)},
        "rollout": {"workers": 1, "num_cpus_per_worker": 1, "group_size": 2, "groups_per_step": 1,
                    "max_groups_in_flight": 1},
        "train": {"steps": 2, "checkpoint_every": 2, "ray_address": address,
                  "node_mismatch": mismatch},
        "eval": {"heldout_episodes": 0},
        "output": {"tensorboard": False, "plots": False, "progress": False},
    })


def test_train_refuses_a_mixed_cluster_then_measures_it_when_told(mixed_cluster, model_dir,
                                                                   tmp_path):
    """Learner and worker need one CPU each and each node has one: they land on different
    nodes. By default the run stops before any update; with "warn" it trains, counts the
    mismatch, and is/d3_mismatch is no longer 0."""
    from parity.trainer import backends
    from parity.trainer.nodes import NodeMismatchError
    from parity.trainer.train import run_training

    with pytest.raises(NodeMismatchError) as e:
        run_training(_cfg(model_dir, mixed_cluster.address, "error"), tmp_path / "refused",
                     backend_factory=backends.engine_backend, episode_factory=episodes)
    assert "learner on" in str(e.value) and "rollout worker 0 on" in str(e.value)
    assert not (tmp_path / "refused" / "metrics.jsonl").exists() or \
        not (tmp_path / "refused" / "metrics.jsonl").read_text().strip()

    summary = run_training(_cfg(model_dir, mixed_cluster.address, "warn"), tmp_path / "warned",
                           backend_factory=backends.engine_backend, episode_factory=episodes)
    assert summary["updates"] == 2 and summary["node_mismatch"] == 1
    assert summary["is/d3_mismatch_max"] > 0


def test_train_refuses_learner_ranks_on_nodes_that_disagree(mixed_cluster, model_dir, tmp_path):
    """Each learner rank computes its own sequences' logprobs, so every rank's node is probed:
    two ranks spread over the two nodes, and the run stops before any update naming both."""
    from parity.trainer import backends
    from parity.trainer.nodes import NodeMismatchError
    from parity.trainer.train import run_training

    cfg = _cfg(model_dir, mixed_cluster.address, "error")
    cfg = cfg.model_copy(update={
        "learner": cfg.learner.model_copy(update={"ranks": 2, "num_cpus": 0.5,
                                                  "placement": "spread"}),
        "rollout": cfg.rollout.model_copy(update={"num_cpus_per_worker": 0.5})})
    with pytest.raises(NodeMismatchError) as e:
        run_training(cfg, tmp_path / "refused", backend_factory=backends.engine_backend,
                     episode_factory=episodes)
    sides = str(e.value).split("; versus ")
    assert len(sides) == 2
    side = {r: [i for i, s in enumerate(sides) if f"learner rank {r} on" in s] for r in (0, 1)}
    assert len(side[0]) == len(side[1]) == 1 and side[0] != side[1]  # a rank on each side
