"""`learner.ranks = 2` with `learner.placement = "spread"` on a real two-node Ray cluster on
this machine (`ray.cluster_utils.Cluster`, 2 CPUs a node, so "pack" would put both ranks on
one): one rank per node, and a train step across the nodes, with parity's decoder and
aligned kernels, gives one learner's logprobs bit for bit and its metrics."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # as `parity train` does
ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

# the whole-batch statistics, equal exactly; the update's (the gradient's sum, the trust
# region's KL of the proposed step and its scale), to a sum's order
EXACT = ("is/d3", "is/d3_mismatch", "kl/rollout_learner", "is/ess_frac", "gate/rejected_frac",
         "lr", "learner/tokens")
CLOSE = ("loss", "grad/norm", "kl/update_sampled", "trust/scale")
UPDATE_BOUND = 1e-5  # max |θ(2 ranks) − θ(1 learner)| after the step (measured: 2.2e-6)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    c.add_node(num_cpus=2)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from parity.model import Decoder, save_model
    from parity.model.shapes import TINY

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("model")
    save_model(Decoder(TINY.model_copy(update={"hidden_size": 64, "intermediate_size": 128,
                                               "num_hidden_layers": 2})), d)
    return d


def _groups(io, model) -> list:
    """Two groups of two episodes whose μ is `model`'s own logprobs, as aligned rollouts'."""
    from parity.core.types import Trajectory

    g = torch.Generator().manual_seed(1)
    groups = []
    for k in range(2):
        trajs = []
        for r in range(2):
            toks = torch.randint(0, 128, (12 + 5 * r + 3 * k,), generator=g)
            with torch.no_grad():
                lp = io.logprobs(model, toks, [len(toks)]).double().tolist()
            mask = [0] * 4 + [1] * (len(toks) - 4)
            trajs.append(Trajectory(f"g{k}", toks.tolist(), mask,
                                    [0.0] + [x * m for x, m in zip(lp, mask[1:], strict=True)],
                                    [-1] * 4 + [0] * (len(toks) - 4), reward=float(r)))
        groups.append(trajs)
    return groups


def test_spread_puts_a_rank_on_each_node_and_trains_as_one_learner(cluster, model_dir):
    from parity.trainer.backends import parity_model_io
    from parity.trainer.config import TrainConfig
    from parity.trainer.learner import Learner, LearnerSettings
    from parity.trainer.learner_group import LearnerGroup

    cfg = TrainConfig.model_validate({
        "model": {"path": str(model_dir)}, "optim": {"lr": 1e-2},
        "learner": {"ranks": 2, "placement": "spread"},
        "train": {"start_timeout_s": 120, "sync_timeout_s": 60}})
    io = parity_model_io(torch.float32)
    group = LearnerGroup(cfg, io, str(model_dir), str(model_dir))  # its ranks load meanwhile
    one = Learner(LearnerSettings.of(cfg), io.load(str(model_dir), "aligned"), io.logprobs)
    groups = _groups(io, one.model)
    expected = one.train_step(groups)
    assert expected["is/d3"] == 0.0 and expected["kl/rollout_learner"] == 0.0  # μ is exact
    try:
        nodes = [p["node_id"] for p in ray.get([a.placement.remote() for a in group.actors])]
        assert sorted(nodes) == sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        metrics, _ = ray.get(group.train_step.remote(groups))
        published = group.publish.remote()
        [ref], version, _ = ray.get(published)
        weights = ray.get(ref)
        # rank 1 took part in gathering the weights and put nothing in the object store
        assert [len(ray.get(r)[0]) for r in group._calls[published]] == [1, 0]
    finally:
        group.close()
    for k in EXACT:  # is/d3 and kl 0: the ranks' logprobs are the one learner's, bit for bit
        assert metrics[k] == expected[k], k
    for k in CLOSE:
        assert metrics[k] == pytest.approx(expected[k], rel=1e-5), k
    assert version == 1
    worst = max(float((weights[k] - v).abs().max()) for k, v in one.weights().items())
    print(f"max |θ(2 ranks) − θ(1 learner)| after one step: {worst:.3g}")
    assert worst <= UPDATE_BOUND
    assert ray.util.placement_group_table(group.placement_group)["state"] == "REMOVED"
