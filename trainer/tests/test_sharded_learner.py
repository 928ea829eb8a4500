"""A data-parallel learner of 2 ranks (a gloo group of 2 processes) against one learner:
the same logprobs bit for bit, the same whole-batch statistics, the same update to float32
rounding, and a fixed N and seed repeat bit for bit."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tiny import TinyLM, make_group, packed_logprobs
from torch import Tensor

from parity.core.timing import COLLECTIVE
from parity.core.types import Trajectory
from parity.model import packed_logprobs as aligned_logprobs
from parity.model.decoder import Decoder
from parity.model.shapes import TINY
from parity.trainer.config import TrainConfig
from parity.trainer.learner import Learner, LearnerSettings, collate
from parity.trainer.learner_group import too_few_nodes
from parity.trainer.sharded_learner import ShardedLearner, split_by_tokens

# Every whole-batch path at once: the sequence gate drops the noisy group (n_kept is
# global), VCPO's baseline and ESS-scaled LR, the trust region, a tight clip, tiny
# micro-batches, and the D3 split over an older version.
SECTIONS = {"optim": {"lr": 1e-2, "grad_clip": 0.05, "max_update_kl": 1e-4,
                      "update_kl_share": 1.0, "micro_batch_tokens": 6},
            "train": {"max_lag": 2, "mismatch_share": 1.0},
            "loss": {"gate_kl": 0.01, "vcpo_lr": "linear", "vcpo_baseline": True}}
CFG = LearnerSettings.of(TrainConfig.model_validate(SECTIONS))
UPDATE_BOUND = 1e-8  # max |θ(2 ranks) − θ(1 rank)| after one step (measured: 4.66e-10)
RESUME_BOUND = 1e-7  # the same after a second step, from one learner's state (7.45e-09)
EXACT = ("is/d3", "is/d3_mismatch", "is/d3_lag", "is/ess_frac", "is/w_peak_over_median",
         "kl/rollout_learner", "gate/rejected_frac", "lr", "learner/tokens")


def _groups(model: torch.nn.Module, version: int) -> list[list[Trajectory]]:
    return [make_group(model, "a", [[1, 2, 3, 4, 5, 6, 7], [1, 2, 6, 7]], 2, [1.0, 0.0],
                       version),
            make_group(model, "b", [[3, 3, 4], [3, 5, 5, 5, 5, 6], [3, 4]], 1,
                       [0.0, 1.0, 1.0], version),
            make_group(model, "c", [[2, 9, 9, 1], [2, 8]], 1, [1.0, 0.0], version, noise=0.5)]


def _run(learner: Learner) -> dict[str, Any]:
    """Three updates, the last on exact rollouts of versions 0 and 1; the first batch's
    logprobs under θ_0, each step's metrics, the weights after the first and the last step."""
    g0 = _groups(TinyLM(), 0)
    b = collate(g0)
    out: dict[str, Any] = {"logprobs": learner._forward_all(b, learner._micro_batches(b), "lp")}
    out["metrics"] = [learner.train_step(g0)]
    out["first"] = {k: v.clone() for k, v in learner.model.state_dict().items()}
    policy1 = TinyLM()
    policy1.load_state_dict(learner.history[1])  # θ_1, the rollouts' policy of version 1
    g1 = _groups(policy1, 1)
    out["metrics"].append(learner.train_step(g1))
    out["metrics"].append(learner.train_step(g0[:1] + g1[1:2]))  # at version 2: lags 2 and 1
    out["last"] = learner.model.state_dict()
    return out


def _aligned_logprobs(learner_class: type[Learner]) -> Tensor:
    """The parity decoder's (aligned kernels, random weights) logprobs of uneven sequences,
    as `learner_class` computes them for a batch."""
    torch.manual_seed(0)
    model = Decoder(TINY, "aligned")
    learner = learner_class(CFG, model, aligned_logprobs)
    b = collate([[Trajectory("g", tokens=list(range(3, 3 + n)), loss_mask=[0] + [1] * (n - 1),
                             logprobs=[0.0] * n, versions=[-1] + [0] * (n - 1), reward=0.0)
                  for n in (17, 5, 30, 9, 12, 2)]])
    return learner._forward_all(b, learner._micro_batches(b), "lp")


def _resumed_from_one_learner() -> float:
    """max |θ| difference after a step that a 2-rank learner takes from one learner's
    checkpointed state (model, AdamW, learner state) and that one learner takes."""
    one = Learner(CFG, TinyLM(), packed_logprobs)
    one.train_step(_groups(TinyLM(), 0))
    model = TinyLM()
    model.load_state_dict(one.model.state_dict())
    sharded = ShardedLearner(CFG, model, packed_logprobs)
    sharded.load_state(one.state(), copy.deepcopy(one.opt.state_dict()))  # as from disk
    g1 = _groups(TinyLM(), 1)
    one.train_step(g1)
    sharded.train_step(g1)
    return max(float((p - q).detach().abs().max())
               for p, q in zip(one.model.parameters(), model.parameters(), strict=True))


def _rank(rank: int, ranks: int, store: str, results: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=ranks)
    torch.set_num_threads(1)
    runs = [_run(ShardedLearner(CFG, TinyLM(), packed_logprobs)) for _ in range(2)]
    learner = ShardedLearner(CFG, TinyLM(), packed_logprobs)
    learner.train_step(_groups(TinyLM(), 0))
    states = {s.name for s in learner.timeline.drain()}
    learner.consolidate()
    optimizer = learner.opt.state_dict() if rank == 0 else None
    torch.save({"runs": runs, "states": states, "optimizer": optimizer,
                "aligned": _aligned_logprobs(ShardedLearner),
                "resumed": _resumed_from_one_learner()},
               Path(results) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _two_ranks(tmp_path: Path) -> list[dict[str, Any]]:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_rank, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_split_by_tokens_balances_real_tokens_deterministically() -> None:
    lengths = torch.tensor([7, 4, 3, 6, 2, 4, 2])
    assert split_by_tokens(lengths, 2) == [[0, 4, 5, 6], [1, 2, 3]]  # 15 and 13 tokens
    assert split_by_tokens(lengths, 1) == [list(range(7))]
    assert split_by_tokens(torch.tensor([5]), 3) == [[0], [], []]


def test_more_ranks_than_the_cluster_holds_fail_at_once_naming_the_keys() -> None:
    cfg = TrainConfig.model_validate({"learner": {"ranks": 3, "num_cpus": 2}})
    nodes = [{"Alive": True, "Resources": {"CPU": 4.0}}, {"Alive": True, "Resources": {"CPU": 1.0}},
             {"Alive": False, "Resources": {"CPU": 8.0}}]
    assert too_few_nodes(cfg, nodes) == (
        "placement: the Ray cluster can hold 2 of the learner.ranks = 3 learner ranks, each of "
        "which needs {'CPU': 2.0} (learner.num_cpus = 2, learner.num_gpus = 0, "
        "learner.resources = {}). Lower learner.ranks or those keys, or add nodes.")
    nodes[1]["Resources"]["CPU"] = 2.0
    assert too_few_nodes(cfg, nodes) is None


def test_two_ranks_compute_one_learners_logprobs_and_update(tmp_path: Path) -> None:
    one = _run(Learner(CFG, TinyLM(), packed_logprobs))
    ranks = _two_ranks(tmp_path)
    for r in ranks:
        a, again = r["runs"]
        assert torch.equal(a["logprobs"], one["logprobs"])
        for k in EXACT:  # the first step's statistics are of θ_0's logprobs: whole-batch, exact
            assert a["metrics"][0][k] == one["metrics"][0][k], k
        assert 0 < a["metrics"][0]["gate/rejected_frac"] < 1
        for k in ("trust/scale", "grad/norm", "loss"):  # of the update, or a sum's order
            assert a["metrics"][0][k] == pytest.approx(one["metrics"][0][k], rel=1e-6), k
        assert a["metrics"][0]["trust/scale"] < 1  # the region bound the step
        assert a["metrics"][2]["is/d3_mismatch"] == 0.0 and a["metrics"][2]["is/d3_share"] == 1.0
        worst = max(float((a["first"][k] - v).abs().max()) for k, v in one["first"].items())
        print(f"max |θ(2 ranks) − θ(1 rank)| after one step: {worst:.3g}")
        assert worst <= UPDATE_BOUND
        for k, v in a["last"].items():  # the same N and seed: bit for bit
            assert torch.equal(v, again["last"][k])
        assert a["metrics"] == again["metrics"]
        assert COLLECTIVE in r["states"]
        assert torch.equal(r["aligned"], _aligned_logprobs(Learner))  # the real kernels
        print(f"resumed from one learner, after a step: {r['resumed']:.3g}")
        assert r["resumed"] <= RESUME_BOUND
    for k, v in ranks[0]["runs"][0]["last"].items():  # every rank holds the same weights
        assert torch.equal(v, ranks[1]["runs"][0]["last"][k])
    full = ranks[0]["optimizer"]  # one learner's layout: any N (or one learner) loads it
    assert ranks[1]["optimizer"] is None
    assert sorted(full["state"]) == list(range(len(list(TinyLM().parameters()))))
