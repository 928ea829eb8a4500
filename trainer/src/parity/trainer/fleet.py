"""The run's Ray actors: the learner and the rollout workers. Placement, node probes,
group calls, versioned weight sync through the object store, hang detection, restarts.

A rollout worker that dies (or stays silent past `train.sync_timeout_s` with a weight update
pending) is replaced, up to `rollout.max_restarts` times each; its unfinished groups go back
to admission to run again. A learner that dies or hangs becomes LearnerDied (train.py
restarts the run from its checkpoint).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from parity.core.timing import HELD, Span, StateClock, Timeline
from parity.trainer.checkpoint import Checkpoint
from parity.trainer.config import TrainConfig
from parity.trainer.driver_state import Counters
from parity.trainer.errors import LearnerDied, RunStopped, cause
from parity.trainer.learner_actor import LearnerActor, ModelIO
from parity.trainer.learner_group import LearnerGroup, handles
from parity.trainer.nodes import (
    NodeMismatchError,
    PlacementError,
    demand,
    disagreement,
    place_process,
    unplaceable,
)
from parity.trainer.rollout import (
    Backend,
    BackendFactory,
    EpisodeFactory,
    GroupResult,
    RolloutWorker,
    WorkerSettings,
)


@dataclass
class _Worker:
    """One rollout worker's slot; `actor` is replaced when it restarts."""

    hold: StateClock  # while the lag bound keeps it from a group it has room for
    actor: Any = None
    version: int = 0  # the newest weights version it has acknowledged
    last_done: float = 0.0  # when its last call finished (or it started)
    restarts: int = 0


class Fleet:
    """The actors of one run; see the module docstring. `rerun` receives the groups a dead
    worker had in flight; `counters` gets its restarts and node mismatches."""

    def __init__(self, cfg: TrainConfig, io: ModelIO, backend_factory: BackendFactory,
                 episode_factory: EpisodeFactory, model_dir: str, load_dir: str,
                 counters: Counters, rerun: Callable[[Iterable[int]], None]) -> None:
        import ray

        self.ray = ray
        self.cfg = cfg
        self.counters = counters
        self.rerun = rerun
        self.backend_factory = backend_factory
        self.episode_factory = episode_factory
        self._placeable(["learner", "rollout worker"])  # before any actor loads a model
        lc = cfg.learner
        self.learner = ray.remote(LearnerActor).options(
            num_cpus=lc.num_cpus, num_gpus=lc.num_gpus, resources=lc.resources,
        ).remote(cfg, io, load_dir, model_dir) if lc.ranks == 1 else \
            LearnerGroup(cfg, io, load_dir, model_dir)
        self.placement: dict[str, dict[str, Any]] = {}  # role -> where it runs (nodes.here)
        self.workers = [_Worker(StateClock(Timeline(f"rollout-{w}"), None, cat="hold"))
                        for w in range(cfg.rollout.workers)]
        self.inflight: dict[Any, tuple[int, int]] = {}  # ref -> (worker, group)
        self.updates: dict[Any, tuple[int, float]] = {}  # ref -> (worker, when it was sent)
        self.weights: tuple[list[Any], int] = ([], 0)  # ([object ref], version) last published
        self.model_config = _parity_config(model_dir) if cfg.model.kernels == "aligned" else None
        self.learner_probes: list[dict[str, Any]] | None = None
        self.started = False  # every actor has been up once: _make_worker is a restart

    # -- start-up -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the workers; wait until every actor is up and the nodes agree."""
        for w, worker in enumerate(self.workers):
            worker.actor = self._make_worker(w)
        roles = [(f"rollout worker {w}", wk.actor) for w, wk in enumerate(self.workers)]
        self._ready([("learner", self.learner), *roles])  # they load their models meanwhile
        self._check_nodes(roles)
        self.started = True

    def restore(self, ckpt: Checkpoint) -> int:
        """Load checkpoint `ckpt` into the learner once it is up; returns its step."""
        self._ready([("learner", self.learner)])
        return self.learner_call(self.learner.restore.remote(ckpt))

    def close(self) -> None:
        for actor in [*(wk.actor for wk in self.workers if wk.actor is not None),
                      *handles(self.learner)]:
            self.ray.kill(actor, no_restart=True)
        if isinstance(self.learner, LearnerGroup):
            self.learner.close()  # gives its placement group's resources back

    def _make_worker(self, w: int) -> Any:
        """Start worker w; a restart also checks that a node can still hold it (its own may be
        gone) and waits until it is up."""
        r = self.cfg.rollout
        if self.started:
            self._placeable(["rollout worker"])
        strategy = "SPREAD" if r.placement == "spread" else "DEFAULT"
        place = functools.partial(place_process, r.num_threads, r.cpu_affinity,
                                  r.num_cpus_per_worker)
        actor = self.ray.remote(RolloutWorker).options(
            num_cpus=r.num_cpus_per_worker, num_gpus=r.num_gpus_per_worker,
            resources=r.resources, scheduling_strategy=strategy, max_concurrency=1000,
        ).remote(w, WorkerSettings.of(self.cfg),
                 functools.partial(_placed, place, functools.partial(self.backend_factory, self.cfg)),
                 functools.partial(self.episode_factory, self.cfg))
        self.workers[w].version = 0
        self.workers[w].last_done = time.time()
        if self.started:  # a restarted worker may land on another node
            self._ready([(f"rollout worker {w}", actor)])
            self._check_nodes([(f"rollout worker {w}", actor)])
        if self.weights[1] > 0:
            self._send_weights(w, actor)
        return actor

    def _placeable(self, roles: list[str]) -> None:
        """PlacementError, naming the config keys, when no alive node could hold one of
        `roles` (keys of _asks) even with nothing else running."""
        nodes = self.ray.nodes()
        asks = _asks(self.cfg)
        for role in roles:
            problem = unplaceable(role, asks[role][1], asks[role][0], nodes)
            if problem:
                raise PlacementError(problem)

    def _ready(self, actors: list[tuple[str, Any]]) -> None:
        """Wait until `actors` ((role, handle)) are placed and constructed, at most
        train.start_timeout_s; a constructor that raised raises here. Records where each
        runs (self.placement); PlacementError naming the keys of any that did not start."""
        t = self.cfg.train.start_timeout_s
        refs = [a.__ray_ready__.remote() for _, a in actors]
        _, late = self.ray.wait(refs, num_returns=len(refs), timeout=t)
        if late:
            roles = [role for (role, _), ref in zip(actors, refs, strict=True) if ref in late]
            asks = _asks(self.cfg)
            keys = sorted({asks[role.rstrip(" 0123456789")][1] for role in roles})
            for h in [h for _, a in actors for h in handles(a)]:
                self.ray.kill(h, no_restart=True)
            raise PlacementError(
                f"placement: the {', '.join(roles)} did not start within "
                f"train.start_timeout_s = {t:g} s. A node could hold it, but its resources are "
                f"taken by other actors, or its process could not start ({'; '.join(keys)}). "
                f"Free or add resources, change those keys, or raise train.start_timeout_s.")
        self.ray.get(refs)
        wheres = self.ray.get([a.placement.remote() for _, a in actors], timeout=t)
        self.placement.update({role: p for (role, _), p in zip(actors, wheres, strict=True)})

    def _check_nodes(self, workers: list[tuple[str, Any]]) -> None:
        """Every node of the job computes aligned kernels' bits alike, or the run stops
        (`train.node_mismatch = "warn"`: it warns and trains on; is/d3_mismatch measures it)."""
        if self.model_config is None:
            return
        if self.learner_probes is None:  # every rank: each computes its own sequences' logprobs
            ranks = handles(self.learner)
            got = self.learner_call([a.node_probe.remote(self.model_config) for a in ranks],
                                    timeout=self.cfg.train.start_timeout_s)
            roles = ["learner"] if len(ranks) == 1 else [f"learner rank {r}" for r in range(len(ranks))]
            self.learner_probes = [{**p, "role": role} for p, role in zip(got, roles, strict=True)]
        probes = [{**p, "role": role} for p, (role, _) in zip(
            self.ray.get([a.node_probe.remote(self.model_config) for _, a in workers],
                         timeout=self.cfg.train.start_timeout_s), workers, strict=True)]
        problem = disagreement([*self.learner_probes, *probes])
        if problem is None:
            return
        if self.cfg.train.node_mismatch == "error":
            raise NodeMismatchError(problem)
        self.counters.node_mismatch = 1
        print(f"parity train: WARNING: {problem}", file=sys.stderr)

    # -- groups and weights ---------------------------------------------------------------
    def load(self) -> list[int]:
        """Each worker's groups in flight."""
        return [sum(1 for ww, _ in self.inflight.values() if ww == w)
                for w in range(len(self.workers))]

    def versions(self) -> list[int]:
        """Each worker's newest acknowledged weights version."""
        return [wk.version for wk in self.workers]

    def run_group(self, g: int, w: int) -> None:
        self.inflight[self.workers[w].actor.run_group.remote(g)] = (w, g)

    def hold(self, held: set[int]) -> None:
        """The workers in `held` are held back by the lag bound from now on; the others not."""
        for w, wk in enumerate(self.workers):
            wk.hold.enter(HELD if w in held else None)

    def publish(self) -> Span:
        """Weight sync: learner -> object store -> every worker (acks arrive later).
        Returns the span of the learner's put."""
        refs, version, put_s = self.learner_call(self.learner.publish.remote(),
                                                 timeout=self.cfg.train.sync_timeout_s)
        span = Span("publish weights", "sync", "learner", time.time() - put_s, put_s,
                    args={"version": version})
        self.weights = (refs, version)
        for w, wk in enumerate(self.workers):
            self._send_weights(w, wk.actor)
        return span

    def _send_weights(self, w: int, actor: Any) -> None:
        refs, version = self.weights
        self.updates[actor.update_weights.remote(refs[0], version)] = (w, time.time())

    def wait(self, also: list[Any]) -> Any | None:
        """The first of the pending calls (groups, weight updates, then `also`) to finish;
        None when a weight update became overdue first (its worker is restarted)."""
        pending = list(self.inflight) + list(self.updates) + also
        ready, _ = self.ray.wait(pending, num_returns=1, timeout=self._sync_wait())
        if not ready:
            self._restart_hung()
            return None
        return ready[0]

    def collect(self, ref: Any) -> tuple[int, GroupResult | Exception] | None:
        """A finished group or weight-update call (from `wait`). Group g's result:
        (g, its GroupResult), or (g, the exception its episode code raised). None for a
        weight update, and when the worker died (it is restarted, its groups run again)."""
        ray = self.ray
        if ref in self.updates:
            w, _ = self.updates.pop(ref)
            self.workers[w].last_done = time.time()
            try:
                self.workers[w].version = max(self.workers[w].version, ray.get(ref))
            except ray.exceptions.RayActorError as e:
                self._restart(w, e)
            return None
        w, g = self.inflight.pop(ref)
        self.workers[w].last_done = time.time()
        try:
            return g, ray.get(ref)
        except ray.exceptions.RayActorError as e:
            self.inflight[ref] = (w, g)
            self._restart(w, e)
            return None
        except ray.exceptions.RayTaskError as e:  # the episode code raised
            return g, e

    def drain_spans(self) -> list[Span]:
        """Every actor's spans so far, the admission holds' too; a worker that does not
        answer is restarted."""
        spans: list[Span] = []
        t = self.cfg.train.sync_timeout_s
        for w, wk in enumerate(self.workers):
            try:
                spans += self.ray.get(wk.actor.drain_spans.remote(), timeout=t)
            except self.ray.exceptions.RayActorError as e:
                self._restart(w, e)
            except self.ray.exceptions.GetTimeoutError:
                self._restart(w, TimeoutError(f"rollout worker {w} did not answer within "
                                              f"train.sync_timeout_s = {t:g} s"))
        spans += self.learner_call(self.learner.drain_spans.remote())
        for wk in self.workers:
            wk.hold.cut()
            spans += wk.hold.timeline.drain()
        return spans

    def learner_call(self, ref: Any, timeout: float | None = None) -> Any:
        """ray.get of a learner call; a dead learner actor, or one that has not answered
        within `timeout`, becomes LearnerDied (train.py restarts it from a checkpoint)."""
        try:
            return self.ray.get(ref, timeout=timeout)
        except self.ray.exceptions.RayActorError as e:
            raise LearnerDied(f"the learner actor died: {cause(e)}") from e
        except self.ray.exceptions.RayTaskError as e:
            if not isinstance(self.learner, LearnerGroup):
                raise
            own = self.learner.own_error(ref)
            if own is not None:  # a rank's own error stops the run, as one learner's does
                raise own from None
            # rank 0's collective failed: another rank died or hung past train.sync_timeout_s
            raise LearnerDied(f"a learner rank failed: {cause(e)}") from e
        except self.ray.exceptions.GetTimeoutError as e:
            for a in handles(self.learner):
                self.ray.kill(a, no_restart=True)
            raise LearnerDied(f"the learner actor hung: no answer within train.sync_timeout_s "
                              f"= {timeout:g} s") from e

    # -- restarts -------------------------------------------------------------------------
    def _sync_wait(self) -> float | None:
        """Seconds until the first pending weight update becomes overdue (None: none pending)."""
        if not self.updates:
            return None
        due = min(max(sent, self.workers[w].last_done) for w, sent in self.updates.values())
        return max(0.0, due + self.cfg.train.sync_timeout_s - time.time())

    def _restart_hung(self) -> None:
        """Restart each worker that has not acknowledged new weights within
        train.sync_timeout_s of its last finished call: its process is stuck."""
        t = self.cfg.train.sync_timeout_s
        now = time.time()
        hung = {w for w, sent in self.updates.values()
                if now - max(sent, self.workers[w].last_done) >= t}
        for w in sorted(hung):
            self._restart(w, TimeoutError(
                f"rollout worker {w} did not load weights version {self.weights[1]} "
                f"within train.sync_timeout_s = {t:g} s"))

    def _restart(self, w: int, err: Exception) -> None:
        print(f"parity train: restarting rollout worker {w}: {cause(err)}", file=sys.stderr)
        wk = self.workers[w]
        wk.restarts += 1
        self.counters.worker_restarts += 1
        limit = self.cfg.rollout.max_restarts
        if wk.restarts > limit:
            raise RunStopped(f"rollout worker {w} died {wk.restarts} times "
                             f"(rollout.max_restarts = {limit}); the last: {cause(err)}")
        lost = sorted(g for ww, g in self.inflight.values() if ww == w)
        self.inflight = {ref: wg for ref, wg in self.inflight.items() if wg[0] != w}
        self.updates = {ref: ws for ref, ws in self.updates.items() if ws[0] != w}
        self.rerun(lost)
        self.ray.kill(wk.actor, no_restart=True)
        wk.actor = self._make_worker(w)


def _asks(cfg: TrainConfig) -> dict[str, tuple[dict[str, float], str]]:
    """Per role: the Ray resources it asks for, and the config keys that set them."""
    lc, r = cfg.learner, cfg.rollout
    return {
        "learner": (demand(lc.num_cpus, lc.num_gpus, lc.resources),
                    f"learner.num_cpus = {lc.num_cpus:g}, learner.num_gpus = "
                    f"{lc.num_gpus:g}, learner.resources = {lc.resources}"),
        "rollout worker": (demand(r.num_cpus_per_worker, r.num_gpus_per_worker, r.resources),
                           f"rollout.num_cpus_per_worker = {r.num_cpus_per_worker:g}, "
                           f"rollout.num_gpus_per_worker = {r.num_gpus_per_worker:g}, "
                           f"rollout.resources = {r.resources}")}


def _placed(place: Callable[[], int], make: Callable[[], Backend]) -> Backend:
    """In a worker's process: its threads and cores first, then its backend loads the model."""
    place()
    return make()


def _parity_config(model_dir: str) -> Any:
    """The model's parity ModelConfig (what node probes run at), or None for other models."""
    from parity.model import ModelConfig, ModelConfigError

    try:
        return ModelConfig.from_pretrained(model_dir)
    except (ModelConfigError, FileNotFoundError):
        return None
