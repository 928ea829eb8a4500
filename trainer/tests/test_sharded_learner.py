"""A data-parallel learner of 2 ranks (a gloo group of 2 processes, parameters, gradients and
AdamW's state sharded by FSDP2) against one learner: the same logprobs bit for bit, the same
whole-batch statistics, the same update to float32 rounding, and a fixed N and seed repeat
bit for bit; sharded checkpoints (torch.distributed.checkpoint) that 2 ranks or one learner
resume exactly, and that a rank killed while writing one leaves unwritten."""

from __future__ import annotations

import copy
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
import tiny
import torch
import torch.distributed as dist
from tiny import TinyLM, make_group, packed_logprobs
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from parity.core.timing import BACKWARD, COLLECTIVE, FORWARD, WAITING
from parity.core.types import Trajectory
from parity.model import gemm
from parity.model import packed_logprobs as aligned_logprobs
from parity.model.decoder import Decoder
from parity.model.shapes import TINY
from parity.trainer import learner_group
from parity.trainer.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from parity.trainer.config import TrainConfig
from parity.trainer.learner import Learner, LearnerSettings, collate
from parity.trainer.learner_actor import ModelIO
from parity.trainer.learner_group import LearnerRank, too_few_nodes
from parity.trainer.sharded_learner import ShardedLearner, split_by_tokens

# Every whole-batch path at once: the sequence gate drops the noisy group (n_kept is
# global), VCPO's baseline and ESS-scaled LR, the trust region, a tight clip, tiny
# micro-batches, and the D3 split over an older version.
SECTIONS = {"optim": {"lr": 1e-2, "grad_clip": 0.05, "max_update_kl": 1e-4,
                      "update_kl_share": 1.0, "micro_batch_tokens": 6},
            "train": {"max_lag": 2, "mismatch_share": 1.0},
            "loss": {"gate_kl": 0.01, "vcpo_lr": "linear", "vcpo_baseline": True}}
CFG = LearnerSettings.of(TrainConfig.model_validate(SECTIONS))
UPDATE_BOUND = 1e-8  # max |θ(2 ranks) − θ(1 rank)| after one step (measured: 1.86e-09)
RESUME_BOUND = 1e-7  # the same after a second step, from one learner's state (measured: 7.45e-09)
# the parity decoder after two steps (measured: 1.19e-07, one float32 ulp of the norms'
# weights, which are near 1)
DECODER_BOUND = 2.5e-7
EXACT = ("is/d3", "is/d3_mismatch", "is/d3_lag", "is/ess_frac", "is/w_peak_over_median",
         "kl/rollout_learner", "gate/rejected_frac", "lr", "learner/tokens")
SOLO = [make_group(TinyLM(), "solo", [[1, 2, 3, 4, 5]], 1, [1.0], 0)]  # fewer sequences than ranks
SMALL = TINY.model_copy(update={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2})
WHOLE = StateDictOptions(full_state_dict=True)  # AdamW's state whole, keyed by parameter name


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
    out["first"] = learner.current_weights()
    policy1 = TinyLM()
    policy1.load_state_dict(out["first"])  # θ_1, the rollouts' policy of version 1
    g1 = _groups(policy1, 1)
    out["metrics"].append(learner.train_step(g1))
    out["metrics"].append(learner.train_step(g0[:1] + g1[1:2]))  # at version 2: lags 2 and 1
    out["last"] = learner.current_weights()
    return out


def _aligned(learner_class: type[Learner], chunk_tokens: int | None = None,
             dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The parity decoder's (aligned kernels, random weights) logprobs of uneven sequences as
    `learner_class` computes them for a batch, under θ_0 and, after an update, under θ_1;
    θ_1's from a fresh decoder loaded with those weights (a learner that computed with
    stale prepared weights would differ); then a step on θ_0's rollouts at version 1 (the D3
    split's shadow forward of θ_0) and the weights after it. Micro-batches of 6 tokens: the
    ranks' counts differ; `chunk_tokens` runs each sequence's forward in chunks; `dtype` is
    what the decoder computes in (its parameters fp32 masters)."""
    torch.manual_seed(0)
    optim = SECTIONS["optim"] | {"chunk_tokens": chunk_tokens}
    cfg = LearnerSettings.of(TrainConfig.model_validate(SECTIONS | {"optim": optim}))
    learner = learner_class(cfg, Decoder(SMALL, "aligned", dtype), aligned_logprobs)
    seqs = [list(range(3, 3 + n)) for n in (17, 5, 30, 9, 12, 2)]

    def groups(mu: Tensor) -> list[list[Trajectory]]:  # rewards 0 and 1; μ: rows [B, W]
        return [[Trajectory("g", s, [0] + [1] * (len(s) - 1), [0.0, *m[:len(s) - 1].tolist()],
                            [-1] + [0] * (len(s) - 1), reward=float(len(s) % 2))
                 for s, m in zip(seqs, mu, strict=True)]]

    b = collate(groups(torch.zeros(len(seqs), max(map(len, seqs)))))
    out: dict[str, Any] = {"θ_0": learner._forward_all(b, learner._micro_batches(b), "lp")}
    learner.train_step(groups(out["θ_0"]))  # μ: θ_0's own, as aligned rollouts'
    out["prepared after a step"] = len(gemm._PREPARED)  # a rank's: none
    out["θ_1"] = learner._forward_all(b, learner._micro_batches(b), "lp")
    fresh = Decoder(SMALL, "aligned", dtype)
    fresh.load_state_dict(learner.current_weights())
    one = Learner(CFG, fresh, aligned_logprobs)
    out["θ_1 fresh"] = one._forward_all(b, one._micro_batches(b), "lp")
    out["lagged step"] = learner.train_step(groups(out["θ_0"]))
    out["θ_2 weights"] = learner.current_weights()
    return out


def _resumed_from_one_learner() -> float:
    """max |θ| difference after a step that a 2-rank learner takes from one learner's
    state (model, AdamW as one learner's optimizer.pt holds it, learner state) and that one
    learner takes."""
    one = Learner(CFG, TinyLM(), packed_logprobs)
    one.train_step(_groups(TinyLM(), 0))
    model = TinyLM()
    model.load_state_dict(one.model.state_dict())
    sharded = ShardedLearner(CFG, model, packed_logprobs)
    sharded.load_state(one.state(), copy.deepcopy(one.opt.state_dict()))  # as from disk
    g1 = _groups(TinyLM(), 1)
    one.train_step(g1)
    sharded.train_step(g1)
    theta = sharded.current_weights()
    return max(float((v - theta[k]).abs().max()) for k, v in one.current_weights().items())


def _rank(rank: int, port: int, tmp: str) -> None:
    """A rank of the group as the fleet makes it (`LearnerRank`): the learners' runs, the
    aligned decoder, checkpoint 1 and its resume, then checkpoint 2, during which rank 1 dies."""
    tmp_path, root = Path(tmp), Path(tmp) / "checkpoints"
    cfg = TrainConfig.model_validate(SECTIONS | {"learner": {"ranks": 2}})
    io = ModelIO(load=tiny.load_tiny, save=tiny.save_tiny, logprobs=packed_logprobs)
    member = LearnerRank(cfg, io, str(tmp_path / "model"), str(tmp_path / "model"), rank,
                         ("127.0.0.1", port))
    out: dict[str, Any] = {"runs": [_run(ShardedLearner(CFG, TinyLM(), packed_logprobs))
                                    for _ in range(2)]}
    _, spans = member.train_step(_groups(TinyLM(), 0))
    out["states"] = {s.name for s in spans}  # rank 0: every rank's
    solo = ShardedLearner(CFG, TinyLM(), packed_logprobs)  # rank 1 gets no sequence
    out["solo"] = solo.train_step(SOLO), solo.current_weights()
    member.checkpoint(str(root), 1, None, 3)
    learner = member.learner
    out["state"], out["weights"] = learner.state(), learner.current_weights()
    out["optimizer"] = get_optimizer_state_dict(learner.model, learner.opt, options=WHOLE)
    again = ShardedLearner(CFG, TinyLM(), packed_logprobs)  # at the same N
    again.load_state(learner.state(), root / "step_000001" / "optimizer")
    out["resumed"] = get_optimizer_state_dict(again.model, again.opt, options=WHOLE)
    out["aligned"] = _aligned(ShardedLearner)
    out["aligned, chunked"] = _aligned(ShardedLearner, chunk_tokens=4)
    out["aligned, bf16"] = _aligned(ShardedLearner, dtype=torch.bfloat16)
    out["from one learner"] = _resumed_from_one_learner()
    torch.save(out, tmp_path / f"rank{rank}.pt")
    member.train_step(_groups(TinyLM(), 1))
    if rank == 1:  # killed as it is about to write its shards of checkpoint 2
        learner_group.save_optimizer = lambda *_: os._exit(1)
    try:
        member.checkpoint(str(root), 2, None, 3)
    except CheckpointError as e:
        (tmp_path / "killed.txt").write_text(str(e))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Two ranks in a gloo group (the driver's TCPStore here); their results."""
    tmp = tmp_path_factory.mktemp("ranks")
    (tmp / "model").mkdir()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    procs = [multiprocessing.get_context("spawn").Process(target=_rank, args=(r, store.port, str(tmp)))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
        if p.is_alive():  # hung: the exit codes below fail the test
            p.kill()
    assert [p.exitcode for p in procs] == [0, 1]  # rank 1 died in checkpoint 2
    return tmp, [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _equal(a: Any, b: Any) -> bool:
    """Nested state dicts equal, their tensors bit for bit."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return torch.equal(a, b) if isinstance(a, Tensor) else a == b


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


def test_two_ranks_compute_one_learners_logprobs_and_update(ranks) -> None:
    one = _run(Learner(CFG, TinyLM(), packed_logprobs))
    aligned = _aligned(Learner)
    aligned_bf16 = _aligned(Learner, dtype=torch.bfloat16)
    _, results = ranks
    for r in results:
        a, again = r["runs"]
        assert torch.equal(a["logprobs"], one["logprobs"])
        for k in EXACT:  # the first step's statistics are of θ_0's logprobs: whole-batch, exact
            assert a["metrics"][0][k] == one["metrics"][0][k], k
        assert 0 < a["metrics"][0]["gate/rejected_frac"] < 1
        for k in ("trust/scale", "grad/norm", "loss"):  # of the update, or a sum's order
            assert a["metrics"][0][k] == pytest.approx(one["metrics"][0][k], rel=1e-6), k
        assert a["metrics"][0]["trust/scale"] < 1  # the region bound the step
        assert a["metrics"][0]["grad/norm"] > CFG.optim.grad_clip  # the global norm was clipped
        assert a["metrics"][2]["is/d3_mismatch"] == 0.0 and a["metrics"][2]["is/d3_share"] == 1.0
        worst = max(float((a["first"][k] - v).abs().max()) for k, v in one["first"].items())
        print(f"max |θ(2 ranks) − θ(1 rank)| after one step: {worst:.3g}")
        assert worst <= UPDATE_BOUND
        assert _equal(a["last"], again["last"])  # the same N and seed: bit for bit
        assert a["metrics"] == again["metrics"]
        for a, one_learner in ((r["aligned"], aligned), (r["aligned, chunked"], aligned),
                               (r["aligned, bf16"], aligned_bf16)):  # the real kernels, by layer
            assert torch.equal(a["θ_0"], one_learner["θ_0"])
            assert torch.equal(a["θ_1"], a["θ_1 fresh"])  # not stale
            assert a["prepared after a step"] == 0  # each layer's copies went with its weights
            lagged = a["lagged step"]
            assert lagged["is/d3_mismatch"] == 0.0 and lagged["is/d3_share"] == 1.0
            assert lagged["lag/mean"] == 1.0  # the split's shadow forward ran, on θ_0
            worst = max(float((a["θ_2 weights"][k] - v).abs().max())
                        for k, v in one_learner["θ_2 weights"].items())
            print(f"decoder: max |θ(2 ranks) − θ(1 rank)| after two steps: {worst:.3g}")
            assert worst <= DECODER_BOUND
        print(f"resumed from one learner, after a step: {r['from one learner']:.3g}")
        assert r["from one learner"] <= RESUME_BOUND
    solo = Learner(CFG, TinyLM(), packed_logprobs)
    solo_metrics = solo.train_step(SOLO)
    for r in results:  # rank 0's sequence, plus rank 1's zero gradient: one learner's step
        assert r["solo"][0] == solo_metrics and _equal(r["solo"][1], solo.current_weights())
    assert COLLECTIVE in results[0]["states"]  # rank 0's: every rank's spans
    assert _equal(results[0]["runs"][0]["last"], results[1]["runs"][0]["last"])  # one model


def test_sharded_checkpoints_resume_at_the_same_n_and_as_one_learner_exactly(ranks) -> None:
    tmp, results = ranks
    path = tmp / "checkpoints" / "step_000001"
    assert sorted(f.name for f in (path / "optimizer").iterdir()) == \
        [".metadata", "__0_0.distcp", "__1_0.distcp"]  # a file per rank
    for r in results:  # 2 ranks: each rank's shards, whole, as before
        assert _equal(r["resumed"], r["optimizer"])
    ckpt = load_checkpoint(path)
    one = Learner(CFG, tiny.load_tiny(str(ckpt.model_dir)), packed_logprobs)
    one.load_state(ckpt.learner, ckpt.optimizer)  # one learner: whole tensors
    assert _equal(get_optimizer_state_dict(one.model, one.opt), results[0]["optimizer"])
    assert _equal(one.current_weights(), results[0]["weights"])  # the model dir: gathered
    assert one.version == 1 and _equal(one.state(), results[0]["state"])


def _resume_at_three(rank: int, tmp: str) -> None:
    """A rank of 3 resuming the 2 ranks' checkpoint 1: AdamW's state whole, as it read it."""
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store-of-three", rank=rank,
                            world_size=3)
    ckpt = load_checkpoint(Path(tmp) / "checkpoints" / "step_000001")
    learner = ShardedLearner(CFG, tiny.load_tiny(str(ckpt.model_dir)), packed_logprobs)
    learner.load_state(ckpt.learner, ckpt.optimizer)
    whole = get_optimizer_state_dict(learner.model, learner.opt, options=WHOLE)
    if rank == 0:
        torch.save({"optimizer": whole, "state": learner.state()}, Path(tmp) / "three.pt")
    dist.destroy_process_group()


def test_two_ranks_checkpoint_resumes_at_three_ranks_exactly(ranks) -> None:
    """Resharding to another N than one: every shard of AdamW's state lands where 3 ranks
    hold it, bit for bit."""
    tmp, results = ranks
    procs = [multiprocessing.get_context("spawn").Process(target=_resume_at_three, args=(r, str(tmp)))
             for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0, 0]
    three = torch.load(tmp / "three.pt", weights_only=False)
    assert _equal(three["optimizer"], results[0]["optimizer"])
    assert three["state"]["version"] == 1


def test_a_rank_killed_while_checkpointing_leaves_no_checkpoint(ranks) -> None:
    tmp, _ = ranks
    root = tmp / "checkpoints"
    assert "writing checkpoint" in (tmp / "killed.txt").read_text()  # rank 0's CheckpointError
    assert latest_checkpoint(root) == root / "step_000001"
    assert not (root / "step_000002").exists() and not list(root.glob(".step_*"))


def test_each_layers_fsdp_collectives_are_timed_as_waiting_on_collectives() -> None:
    """A forward and a backward of a 2-layer decoder on a rank (a group of one): FSDP gathers
    each layer before its forward and its backward and reduce-scatters its gradient after
    its backward, each a COLLECTIVE stretch of the rank's clock between the pass's own."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        learner = ShardedLearner(CFG, Decoder(SMALL, "aligned"), aligned_logprobs)
        learner._gather()  # the root unit, as a step begins
        with learner.clock.during(FORWARD):
            lp = aligned_logprobs(learner.model, torch.arange(3, 12), [9])
        with learner.clock.during(BACKWARD):
            lp.sum().backward()
        learner.clock.cut()
        states = [s.name for s in learner.timeline.drain()]
    finally:
        dist.destroy_process_group()
    c, f, b = COLLECTIVE, FORWARD, BACKWARD
    assert [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]] == [
        WAITING, c, WAITING, f, c, f, c, f, WAITING,  # the root, then a gather per layer
        b, c, b, c, b, c, b, c, b, WAITING]  # layer 1: gather, reduce; then layer 0
