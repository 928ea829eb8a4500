"""The learner as `learner.ranks` Ray actors in one torch.distributed group (gloo on CPU;
NCCL for GPU tensors when each rank has a GPU), each a `ShardedLearner`
(parity.trainer.sharded_learner).

The driver holds the group's TCPStore (every rank can reach it, whichever node it lands
on); the ranks meet there when they start. `LearnerGroup` is the fleet's learner handle: a
call runs on every rank, which meet in its collectives, and answers with rank 0's result;
placement asks rank 0 alone (the fleet probes every rank's node: `handles`). Publishing gathers the weights from every rank's
shards onto each (FSDP's parameters are sharded) and rank 0 alone puts them in the object
store, so weights cross to the rollout workers once per version, not once per rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.core.timing import CHECKPOINTING, PUBLISHING, Span
from parity.core.types import Trajectory
from parity.trainer.checkpoint import partial_dir, save_checkpoint, save_optimizer
from parity.trainer.config import TrainConfig
from parity.trainer.driver_state import DriverState
from parity.trainer.learner_actor import LearnerActor, ModelIO
from parity.trainer.nodes import PlacementError, demand
from parity.trainer.sharded_learner import ShardedLearner

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

RANK0_ONLY = frozenset({"placement"})


class LearnerRank(LearnerActor):
    """Rank `rank` of the learner group; joins it through the driver's store at `store`
    (host, port) before it loads the model. A collective that waits past
    train.sync_timeout_s raises (the fleet then restarts the run from its checkpoint)."""

    learner_class = ShardedLearner
    learner: ShardedLearner

    def __init__(self, cfg: TrainConfig, io: ModelIO, load_dir: str, model_dir: str,
                 rank: int, store: tuple[str, int]) -> None:
        import torch.distributed as dist

        t = cfg.train
        # per device: the per-sequence rows and the spans are CPU tensors even on GPU ranks
        backend = "cpu:gloo,cuda:nccl" if cfg.learner.num_gpus else "gloo"
        dist.init_process_group(
            backend, rank=rank, world_size=cfg.learner.ranks,
            store=dist.TCPStore(*store, is_master=False,
                                timeout=timedelta(seconds=t.start_timeout_s)),
            timeout=timedelta(seconds=t.sync_timeout_s))
        super().__init__(cfg, io, load_dir, model_dir)

    def train_step(self, groups: list[list[Trajectory]]) -> tuple[dict[str, float], list[Span]]:
        metrics, spans = super().train_step(groups)
        return metrics, self._gathered(spans)

    def drain_spans(self) -> list[Span]:
        return self._gathered(super().drain_spans())

    def publish(self) -> tuple[list[Any], int, float]:
        """Rank 0: as one learner. The others take part in gathering the weights: ([], ...)."""
        if self.learner.rank == 0:
            return super().publish()
        t0 = time.time()
        with self.learner.clock.during(PUBLISHING):
            self.learner.current_weights()
        return [], self.learner.version, time.time() - t0

    def checkpoint(self, root: str, step: int, driver: DriverState, keep: int) -> str:
        """Every rank writes its shards of AdamW's state into checkpoint `step`'s temporary
        directory (torch.distributed.checkpoint); rank 0 writes the rest (the model, whole,
        gathered from the ranks) and renames it into place once every shard is written: a
        rank that dies meanwhile fails the write, which leaves no checkpoint. Any N, or one
        learner, resumes it. Returns its path on rank 0, "" on the others."""
        import torch.distributed as dist

        learner = self.learner
        with learner.clock.during(CHECKPOINTING), learner.masters() as model:

            def write_optimizer(d: Path) -> None:
                dist.barrier()  # rank 0 has cleared `d`: every rank may write into it
                save_optimizer(learner.model, learner.opt, d / "optimizer")

            if learner.rank:
                write_optimizer(partial_dir(Path(root), step))
                return ""
            path = save_checkpoint(Path(root), step, write_model=lambda d: self._write_model(model, d),
                                   optimizer=write_optimizer, learner=learner.state(),
                                   driver=driver, keep=keep)
        return str(path)

    def _gathered(self, spans: list[Span]) -> list[Span]:
        """Every rank's `spans` on rank 0 (its own first); [] on the others."""
        import torch.distributed as dist

        parts: list[list[Span]] | None = [[] for _ in range(self.learner.ranks)] \
            if self.learner.rank == 0 else None
        dist.gather_object(spans, parts, dst=0)
        return [s for part in parts for s in part] if parts is not None else []


@dataclass(frozen=True)
class _Call:
    """One method of the group: `.remote(...)` calls it on `actors`, returns the first's ref
    and keeps every rank's in `calls` under it (the newest CALLS_KEPT calls)."""

    actors: list[Any]
    name: str
    calls: dict[Any, list[Any]]

    def remote(self, *args: Any) -> Any:
        refs = [getattr(a, self.name).remote(*args) for a in self.actors]  # every rank
        self.calls[refs[0]] = refs
        while len(self.calls) > CALLS_KEPT:
            del self.calls[next(iter(self.calls))]
        return refs[0]


CALLS_KEPT = 16  # calls whose every rank's ref the group keeps (a step makes a few)
SETTLE_S = 2.0  # how long a failed call's other ranks are given to report (own_error)


def failed_collective(err: BaseException) -> bool:
    """Whether a rank's error is one of its collectives failing, which another rank's death
    or hang causes: torch.distributed's errors (NCCL's), or gloo's RuntimeError, which names
    gloo's source file."""
    import torch.distributed as dist

    return isinstance(err, dist.DistError) or (isinstance(err, RuntimeError) and "/gloo/" in str(err))


class LearnerGroup:
    """The learner ranks behind one handle, as the fleet calls a single learner actor. The
    ranks run in a Ray placement group (one bundle each, learner.placement), reserved until
    `close`."""

    def __init__(self, cfg: TrainConfig, io: ModelIO, load_dir: str, model_dir: str) -> None:
        import ray
        import torch.distributed as dist
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        problem = too_few_nodes(cfg, ray.nodes())
        if problem:
            raise PlacementError(problem)
        self.placement_group = _reserve(cfg)
        host = ray.util.get_node_ip_address()
        self.store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=cfg.train.start_timeout_s))
        lc = cfg.learner
        self._calls: dict[Any, list[Any]] = {}  # rank 0's ref -> every rank's (`_Call`)
        self.actors = [ray.remote(LearnerRank).options(
            num_cpus=lc.num_cpus, num_gpus=lc.num_gpus, resources=lc.resources,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=r),
        ).remote(cfg, io, load_dir, model_dir, r, (host, self.store.port))
            for r in range(lc.ranks)]

    def __getattr__(self, name: str) -> _Call:
        if name == "_calls":  # looked up before __init__ set it (copy, pickle)
            raise AttributeError(name)
        return _Call(self.actors[:1] if name in RANK0_ONLY else self.actors, name, self._calls)

    def own_error(self, ref: Any) -> BaseException | None:
        """Of the call whose rank-0 ref is `ref` (or of the refs `ref`), a rank's error that is
        its own: Ray's RayTaskError of an exception other than a failed collective (a bug, a
        full disk), rank 0's first. None, a restart's case, when a rank died (the others'
        errors follow from its death, whatever they say: a checkpoint write that lost a rank
        fails as a CheckpointError) or every error is a failed collective (a rank hung).
        Waits up to SETTLE_S for the ranks' results to arrive (Ray sees a death a moment
        after the rank's peers do)."""
        import ray

        refs = ref if isinstance(ref, list) else self._calls.get(ref, [ref])
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=SETTLE_S)
        errors = []
        for r in [r for r in refs if r in done]:
            try:
                ray.get(r)
            except ray.exceptions.RayActorError:
                return None
            except ray.exceptions.RayTaskError as e:
                errors.append(e)
        for e in errors:
            inner = getattr(e, "cause", None)
            if isinstance(inner, BaseException) and not failed_collective(inner):
                return e
        return None

    def close(self) -> None:
        """Kill the ranks and give their placement group's resources back to the cluster."""
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        ray.util.remove_placement_group(self.placement_group)


def _bundle(cfg: TrainConfig) -> dict[str, float]:
    """The Ray resources one rank asks for (those it asks for at all)."""
    lc = cfg.learner
    return {k: v for k, v in demand(lc.num_cpus, lc.num_gpus, lc.resources).items() if v > 0}


def _keys(cfg: TrainConfig) -> str:
    """The keys that size a rank, as error text names them."""
    lc = cfg.learner
    return (f"learner.num_cpus = {lc.num_cpus:g}, learner.num_gpus = {lc.num_gpus:g}, "
            f"learner.resources = {lc.resources}")


def _reserve(cfg: TrainConfig) -> PlacementGroup:
    """A placement group of a bundle per rank, placed by learner.placement; PlacementError
    naming the keys when it is not placed within train.start_timeout_s (the resources
    exist, too_few_nodes checked, but other actors hold them)."""
    import ray

    lc, t = cfg.learner, cfg.train.start_timeout_s
    # STRICT_SPREAD: Ray's SPREAD is best effort and may put two ranks on one node even when
    # another node could hold one (it did on CI), which would break the one-rank-per-node promise.
    strategy = {"pack": "PACK", "spread": "STRICT_SPREAD"}[lc.placement]
    pg = ray.util.placement_group([_bundle(cfg)] * lc.ranks, strategy=strategy)
    if pg.wait(timeout_seconds=t):
        return pg
    ray.util.remove_placement_group(pg)  # Ray would go on waiting for the resources
    raise PlacementError(
        f"placement: the learner.ranks = {lc.ranks} learner ranks (learner.placement = "
        f"\"{lc.placement}\") were not placed within train.start_timeout_s = {t:g} s. The "
        f"cluster could hold them, but other actors hold its resources ({_keys(cfg)}). Free "
        f"or add resources, change those keys, or raise train.start_timeout_s.")


def too_few_nodes(cfg: TrainConfig, nodes: list[dict[str, Any]]) -> str | None:
    """None if the alive `nodes` (ray.nodes()) could hold learner.ranks ranks at once, with
    nothing else running, as learner.placement places them (spread: one rank per node);
    else the error text naming the keys."""
    lc = cfg.learner
    need = _bundle(cfg)
    per_node = [int(min(n["Resources"].get(k, 0.0) // v for k, v in need.items()))
                for n in nodes if n.get("Alive")]
    spread = lc.placement == "spread"
    fits = sum(min(f, 1) for f in per_node) if spread else sum(per_node)
    if fits >= lc.ranks:
        return None
    how = ' one per node (learner.placement = "spread")' if spread else ""
    pack = 'set learner.placement = "pack", ' if spread else ""
    return (f"placement: the Ray cluster can hold {fits} of the learner.ranks = {lc.ranks} "
            f"learner ranks{how}, each of which needs {need} ({_keys(cfg)}). Lower "
            f"learner.ranks or those keys, {pack}or add nodes.")


def handles(learner: Any) -> list[Any]:
    """The Ray actors behind the fleet's learner handle (to kill them)."""
    return learner.actors if isinstance(learner, LearnerGroup) else [learner]
