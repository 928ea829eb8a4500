"""The driver: Ray actors for the learner and the rollout workers, bounded-lag admission,
versioned weight sync through the object store, metrics, checkpoints, resume, restarts.

Groups are numbered 0, 1, 2, … in the order they are started (group g runs the task
`env.task_seed + g`); the learner consumes them in index order, n = `groups_per_step` per
step, whatever order they finish in, so step s trains on groups [s·n, (s+1)·n). Admission
control starts group g on a worker holding version v only if g < (v + max_lag + 1)·n, so
every token of group g was sampled by a version ≥ s − max_lag: staleness is bounded
without dropping finished work (workers simply get no new group when too far ahead).
Sync mode is max_lag 0. A group whose episode code raises is dropped, counted with its
reason, and the next index takes its place (the bound then applies to g minus the number
of dropped groups below it: its place in consumption order). Episodes that failed outside
the agent (`Trajectory.failure`) never train: their group trains on the rest, or is dropped
the same way when too few remain (parity.trainer.failures); a step's `env/failures/*` count
the episodes of every group it consumed, trained on or dropped.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

from parity.core.timing import HELD, IDLE, Span, StateClock, Timeline, step_seconds
from parity.core.types import Trajectory
from parity.trainer.checkpoint import Checkpoint
from parity.trainer.config import TrainConfig
from parity.trainer.evaluate import pass_rate
from parity.trainer.failures import describe, failure_metrics, too_few_left, usable
from parity.trainer.learner_actor import LearnerActor, ModelIO
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
from parity.trainer.rundir import RunDir, sample_episode


class Orchestrator:
    """Runs `cfg.train.steps` updates; see the module docstring."""

    def __init__(self, cfg: TrainConfig, run: RunDir, io: ModelIO,
                 backend_factory: BackendFactory, episode_factory: EpisodeFactory,
                 model_dir: str, resume: Checkpoint | None = None,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        import ray

        self.ray = ray
        self.cfg = cfg
        self.run_dir = run
        self.n = cfg.rollout.groups_per_step
        self.on_step = on_step
        self.backend_factory = backend_factory
        self.episode_factory = episode_factory
        lc, r = cfg.learner, cfg.rollout
        self.asks = {  # role -> (Ray resources, the config keys that set them)
            "learner": (demand(lc.num_cpus, lc.num_gpus, lc.resources),
                        f"learner.num_cpus = {lc.num_cpus:g}, learner.num_gpus = "
                        f"{lc.num_gpus:g}, learner.resources = {lc.resources}"),
            "rollout worker": (demand(r.num_cpus_per_worker, r.num_gpus_per_worker, r.resources),
                               f"rollout.num_cpus_per_worker = {r.num_cpus_per_worker:g}, "
                               f"rollout.num_gpus_per_worker = {r.num_gpus_per_worker:g}, "
                               f"rollout.resources = {r.resources}")}
        self._placeable(["learner", "rollout worker"])  # before any actor loads a model
        self.learner = ray.remote(LearnerActor).options(
            num_cpus=lc.num_cpus, num_gpus=lc.num_gpus, resources=lc.resources,
        ).remote(cfg, io, str(resume.model_dir) if resume else model_dir, model_dir)
        self.placement: dict[str, dict[str, Any]] = {}  # role -> where it runs (nodes.here)
        self.step = 0
        self.cursor = 0  # next group index to start
        self.done: dict[int, list[Trajectory]] = {}  # finished groups (dropped ones too)
        self.retry: list[int] = []  # groups to run again (their worker crashed)
        self.counters = {"dropped": 0, "worker_restarts": 0, "skipped_nonfinite": 0,
                         "learner_restarts": 0}
        self.dropped_in_a_row = 0
        self.without_signal = 0  # steps in a row without a learning signal (not checkpointed)
        self.consumed = 0  # groups below this index are trained on or dropped
        self.dropped: dict[int, str] = {}  # group -> reason
        if resume is not None:
            self._ready([("learner", self.learner)])
            self.step = self._learner_call(self.learner.restore.remote(resume))
            d = resume.state["driver"]
            self.cursor, self.counters = d["cursor"], {**self.counters, **d["counters"]}
            self.consumed, self.dropped = d["consumed"], d["dropped"]
            self.done = resume.queue[0]
            self.retry = [g for g in range(self.consumed, self.cursor)
                          if g not in self.done and g not in self.dropped]
        self.workers: list[Any] = []
        self.restarts = [0] * cfg.rollout.workers
        self.inflight: dict[Any, tuple[int, int]] = {}  # ref -> (worker, group)
        self.updates: dict[Any, int] = {}  # ref -> worker
        self.update_sent: dict[Any, float] = {}  # ref -> when it was sent
        self.last_done = [time.time()] * cfg.rollout.workers  # a worker's last finished call
        self.worker_version = [0] * cfg.rollout.workers
        self.weights_ref: list[Any] = []
        self.weights_version = 0
        self.spans: list[Span] = []
        # per worker: while the lag bound keeps it from getting a group it has room for
        self.holds = [StateClock(Timeline(f"rollout-{w}"), None, cat="hold")
                      for w in range(cfg.rollout.workers)]
        self.model_config = _parity_config(model_dir) if cfg.model.kernels == "aligned" else None
        self.learner_probe: dict[str, Any] | None = None
        self.started = False  # every actor has been up once: _make_worker is a restart

    # -- workers --------------------------------------------------------------------------
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
        self.worker_version[w] = 0
        self.last_done[w] = time.time()
        if self.started:  # a restarted worker may land on another node
            self._ready([(f"rollout worker {w}", actor)])
            self._check_nodes([(f"rollout worker {w}", actor)])
        if self.weights_version > 0:
            self._send_weights(w, actor)
        return actor

    def _check_nodes(self, workers: list[tuple[str, Any]]) -> None:
        """Every node of the job computes aligned kernels' bits alike, or the run stops
        (`train.node_mismatch = "warn"`: it warns and trains on; is/d3_mismatch measures it)."""
        if self.model_config is None:
            return
        ray = self.ray
        if self.learner_probe is None:
            probe = self._learner_call(self.learner.node_probe.remote(self.model_config))
            self.learner_probe = {**probe, "role": "learner"}
        probes = [{**p, "role": role} for p, (role, _) in zip(
            ray.get([a.node_probe.remote(self.model_config) for _, a in workers],
                    timeout=self.cfg.train.start_timeout_s), workers, strict=True)]
        problem = disagreement([self.learner_probe, *probes])
        if problem is None:
            return
        if self.cfg.train.node_mismatch == "error":
            raise NodeMismatchError(problem)
        self.counters["node_mismatch"] = 1
        print(f"parity train: WARNING: {problem}", file=sys.stderr)

    def _send_weights(self, w: int, actor: Any) -> None:
        ref = actor.update_weights.remote(self.weights_ref[0], self.weights_version)
        self.updates[ref] = w
        self.update_sent[ref] = time.time()

    def _placeable(self, roles: list[str]) -> None:
        """PlacementError, naming the config keys, when no alive node could hold one of
        `roles` (keys of self.asks) even with nothing else running."""
        nodes = self.ray.nodes()
        for role in roles:
            problem = unplaceable(role, self.asks[role][1], self.asks[role][0], nodes)
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
            keys = sorted({self.asks[role.rstrip(" 0123456789")][1] for role in roles})
            for _, a in actors:
                self.ray.kill(a, no_restart=True)
            raise PlacementError(
                f"placement: the {', '.join(roles)} did not start within "
                f"train.start_timeout_s = {t:g} s. A node could hold it, but its resources are "
                f"taken by other actors, or its process could not start ({'; '.join(keys)}). "
                f"Free or add resources, change those keys, or raise train.start_timeout_s.")
        self.ray.get(refs)
        wheres = self.ray.get([a.placement.remote() for _, a in actors], timeout=t)
        self.placement.update({role: p for (role, _), p in zip(actors, wheres, strict=True)})

    def _restart(self, w: int, err: Exception) -> None:
        print(f"parity train: restarting rollout worker {w}: {_cause(err)}", file=sys.stderr)
        self.restarts[w] += 1
        self.counters["worker_restarts"] += 1
        if self.restarts[w] > self.cfg.rollout.max_restarts:
            raise RunStopped(f"rollout worker {w} died {self.restarts[w]} times "
                             f"(rollout.max_restarts = {self.cfg.rollout.max_restarts}); "
                             f"the last: {_cause(err)}")
        lost = sorted(g for ref, (ww, g) in list(self.inflight.items()) if ww == w)
        for ref in [ref for ref, (ww, _) in self.inflight.items() if ww == w]:
            del self.inflight[ref]
        for ref in [ref for ref, ww in self.updates.items() if ww == w]:
            del self.updates[ref], self.update_sent[ref]
        self.retry = sorted(set(self.retry) | set(lost))
        self.ray.kill(self.workers[w], no_restart=True)
        self.workers[w] = self._make_worker(w)

    def _admit(self) -> None:
        """Start groups on workers with room, oldest pending first, within the lag bound."""
        total = self.cfg.train.steps * self.n + len(self.dropped)
        cap = self.cfg.rollout.max_groups_in_flight
        while True:
            g = self.retry[0] if self.retry else self.cursor
            if g >= total:
                self._hold(set())
                return
            load = [sum(1 for ww, _ in self.inflight.values() if ww == w)
                    for w in range(len(self.workers))]
            slot = g - sum(1 for d in self.dropped if d < g)  # its place in consumption order
            ok = [w for w in range(len(self.workers)) if load[w] < cap
                  and slot < (self.worker_version[w] + self.cfg.max_lag + 1) * self.n]
            if not ok:
                self._hold({w for w in range(len(self.workers)) if load[w] < cap})
                return
            w = min(ok, key=lambda w: (load[w], w))
            ref = self.workers[w].run_group.remote(g)
            self.inflight[ref] = (w, g)
            if self.retry:
                self.retry.pop(0)
            else:
                self.cursor += 1

    def _hold(self, held: set[int]) -> None:
        for w, clock in enumerate(self.holds):
            clock.enter(HELD if w in held else None)

    # -- main loop ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to `train.steps`; the actors are gone afterwards, however the run ended."""
        try:
            return self._loop()
        finally:
            for actor in [*self.workers, self.learner]:
                self.ray.kill(actor, no_restart=True)

    def _loop(self) -> dict[str, Any]:
        ray = self.ray
        self.workers = [self._make_worker(w) for w in range(self.cfg.rollout.workers)]
        roles = [(f"rollout worker {w}", a) for w, a in enumerate(self.workers)]
        self._ready([("learner", self.learner), *roles])  # they load their models meanwhile
        self._check_nodes(roles)
        self.started = True
        if self.step > 0:
            self._publish()
        train_ref = None
        wait_start = time.time()
        step_start = time.time()
        while self.step < self.cfg.train.steps:
            self._admit()
            need = self._next_groups()
            if train_ref is None and all(g in self.done for g in need):
                self.spans.append(Span("waiting for data", "learner_wait", "learner", wait_start,
                                       time.time() - wait_start))
                # every finished group up to the last needed: trained on, or dropped
                finished = {g: self.done.pop(g) for g in range(self.consumed, need[-1] + 1)
                            if g in self.done}
                batch = [usable(finished[g]) for g in need]
                self.consumed = need[-1] + 1
                episodes = [t for group in finished.values() for t in group]
                batch_stats = self._env_failures(episodes) | _batch_stats(batch)
                samples = _samples(batch, self.cfg.output.samples_per_step)
                self._learning_signal(batch, batch_stats["reward/mean"])
                train_ref = self.learner.train_step.remote(batch)
            pending = list(self.inflight) + list(self.updates) + ([train_ref] if train_ref else [])
            ready, _ = ray.wait(pending, num_returns=1, timeout=self._sync_wait())
            if not ready:
                self._restart_hung()
                continue
            ref = ready[0]
            if ref is train_ref:
                metrics, spans = self._learner_call(ref)
                train_ref = None
                self.spans += spans
                self._publish()
                self.run_dir.log_samples(self.step, samples)
                rec = self._finish_step(metrics, batch_stats, step_start)
                step_start = wait_start = time.time()
                if self.on_step:
                    self.on_step(rec)
                if self.step % self.cfg.train.checkpoint_every == 0 or \
                        self.step == self.cfg.train.steps:
                    self._checkpoint()
            elif ref in self.updates:
                w = self.updates.pop(ref)
                self.last_done[w] = time.time()
                del self.update_sent[ref]
                try:
                    self.worker_version[w] = max(self.worker_version[w], ray.get(ref))
                except ray.exceptions.RayActorError as e:
                    self._restart(w, e)
            else:
                w, g = self.inflight.pop(ref)
                self.last_done[w] = time.time()
                try:
                    res: GroupResult = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    self.inflight[ref] = (w, g)
                    self._restart(w, e)
                    continue
                except ray.exceptions.RayTaskError as e:  # the episode code raised
                    self._drop(g, type(getattr(e, "cause", None) or e).__name__, _cause(e))
                    continue
                self.spans += res.spans
                self.done[g] = res.trajectories
                if too_few_left(res.trajectories, self.cfg.train.min_group_episodes):
                    self._drop(g, "env_failures", f"{describe(res.trajectories)}, fewer than "
                               f"train.min_group_episodes = "
                               f"{self.cfg.train.min_group_episodes} left")
                else:
                    self.dropped_in_a_row = 0
        return self.counters

    def _learner_call(self, ref: Any, timeout: float | None = None) -> Any:
        """ray.get of a learner call; a dead learner actor, or one that has not answered
        within `timeout`, becomes LearnerDied (train.py restarts it from a checkpoint)."""
        try:
            return self.ray.get(ref, timeout=timeout)
        except self.ray.exceptions.RayActorError as e:
            raise LearnerDied(f"the learner actor died: {_cause(e)}") from e
        except self.ray.exceptions.GetTimeoutError as e:
            self.ray.kill(self.learner, no_restart=True)
            raise LearnerDied(f"the learner actor hung: no answer within train.sync_timeout_s "
                              f"= {timeout:g} s") from e

    def _sync_wait(self) -> float | None:
        """Seconds until the first pending weight update becomes overdue (None: none pending)."""
        if not self.updates:
            return None
        due = min(max(self.update_sent[ref], self.last_done[w]) for ref, w in self.updates.items())
        return max(0.0, due + self.cfg.train.sync_timeout_s - time.time())

    def _restart_hung(self) -> None:
        """Restart each worker that has not acknowledged new weights within
        train.sync_timeout_s of its last finished call: its process is stuck."""
        t = self.cfg.train.sync_timeout_s
        now = time.time()
        hung = {w for ref, w in self.updates.items()
                if now - max(self.update_sent[ref], self.last_done[w]) >= t}
        for w in sorted(hung):
            self._restart(w, TimeoutError(
                f"rollout worker {w} did not load weights version {self.weights_version} "
                f"within train.sync_timeout_s = {t:g} s"))

    def _env_failures(self, episodes: list[Trajectory]) -> dict[str, float]:
        """The step's episodes that failed outside the agent, by kind; stops the run when
        they are more than `train.max_env_failure_frac` of them."""
        metrics = failure_metrics(episodes)
        if metrics["env/failure_frac"] > self.cfg.train.max_env_failure_frac:
            raise RunStopped(
                f"{describe(episodes)} in step {self.step}, more than "
                f"train.max_env_failure_frac = {self.cfg.train.max_env_failure_frac}: the env "
                f"cannot run properly here")
        return metrics

    def _learning_signal(self, groups: list[list[Trajectory]], mean_reward: float) -> None:
        """Counts the steps in a row whose groups each scored alike (group-mean advantages,
        and so the loss, all 0); stops the run at `train.max_steps_without_signal` of them:
        a run that cannot learn (tasks out of the model's reach, a collapsed policy, a reward
        that cannot tell answers apart) must not run on and exit as if it had."""
        if any(len({t.reward for t in g}) > 1 for g in groups):
            self.without_signal = 0
            return
        self.without_signal += 1
        limit = self.cfg.train.max_steps_without_signal
        if self.without_signal >= limit:
            raise RunStopped(
                f"no learning signal for {self.without_signal} steps in a row, up to step "
                f"{self.step} (train.max_steps_without_signal = {limit}): in every group all "
                f"{len(groups[0])} episodes scored the same (mean reward {mean_reward:.3f}), "
                f"so every advantage was 0; the tasks are "
                f"out of this model's reach, or too easy for it")

    def _next_groups(self) -> list[int]:
        """The indices of the n groups the next step trains on."""
        out, g = [], self.consumed
        while len(out) < self.n:
            if g not in self.dropped:
                out.append(g)
            g += 1
        return out

    def _drop(self, g: int, reason: str, cause: str) -> None:
        """Drop group g (`reason`: the exception its episode code raised, or
        "env_failures"); stop after too many in a row."""
        self.dropped[g] = reason
        self.counters["dropped"] += 1
        self.dropped_in_a_row += 1
        print(f"parity train: group {g} dropped: {cause}", file=sys.stderr)
        limit = self.cfg.train.max_dropped_in_a_row
        if self.dropped_in_a_row >= limit:
            raise RunStopped(f"{self.dropped_in_a_row} groups in a row were dropped "
                             f"(train.max_dropped_in_a_row = {limit}); the last: {cause}")

    def _publish(self) -> None:
        """Weight sync: learner -> object store -> every worker (acks arrive later)."""
        refs, version, put_s = self._learner_call(self.learner.publish.remote(),
                                                  timeout=self.cfg.train.sync_timeout_s)
        self.spans.append(Span("publish weights", "sync", "learner", time.time() - put_s, put_s,
                               args={"version": version}))
        self.weights_ref, self.weights_version = refs, version
        for w, actor in enumerate(self.workers):
            self._send_weights(w, actor)

    def _finish_step(self, metrics: dict[str, float], batch_stats: dict[str, float],
                     step_start: float) -> dict[str, Any]:
        """Assemble, log and return the record of the step just trained."""
        for w, actor in enumerate(self.workers):
            try:
                self.spans += self.ray.get(actor.drain_spans.remote(),
                                           timeout=self.cfg.train.sync_timeout_s)
            except self.ray.exceptions.RayActorError as e:
                self._restart(w, e)
            except self.ray.exceptions.GetTimeoutError:
                self._restart(w, TimeoutError(f"rollout worker {w} did not answer within "
                                              f"train.sync_timeout_s = "
                                              f"{self.cfg.train.sync_timeout_s:g} s"))
        self.spans += self._learner_call(self.learner.drain_spans.remote())
        for clock in self.holds:
            clock.cut()
            self.spans += clock.timeline.drain()
        for s in self.spans:  # time counts towards the step in whose window it arrived
            s.step = self.step
        wall = time.time() - step_start
        # the window the actors' exclusive states are clipped to (timing.state_seconds)
        self.spans.append(Span(f"step {self.step}", "step", "driver", step_start, wall,
                               step=self.step))
        secs = step_seconds(self.spans).get(self.step, {})
        # the workers' idle state (no episode in flight), held or not
        idle = sum(s.dur for s in self.spans if s.cat == "state" and s.name == IDLE
                   and s.track.startswith("rollout"))
        self.counters["skipped_nonfinite"] = int(metrics.pop("count/skipped_nonfinite"))
        tokens = metrics.pop("learner/tokens")
        rec: dict[str, Any] = {
            "step": self.step,
            **batch_stats,
            **metrics,
            "timing/step_s": wall,
            "timing/gen_s": secs.get("gen", 0.0),
            "timing/env_s": secs.get("env", 0.0) + secs.get("reward", 0.0),
            "timing/learner_s": sum(secs.get(c, 0.0) for c in ("learner_fwd", "learner_bwd",
                                                              "optim")),
            "timing/sync_s": secs.get("sync", 0.0),
            "timing/learner_wait_s": secs.get("learner_wait", 0.0),
            "timing/rollout_idle_frac": min(1.0, idle / max(wall * len(self.workers), 1e-9)),
            "throughput/tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "version": self.step + 1,
            **{f"count/{k}": v for k, v in self.counters.items()},
        }
        self.run_dir.log(rec)
        self.run_dir.log_spans(self.spans)
        self.spans = []
        self.step += 1
        return rec

    def _checkpoint(self) -> None:
        with_span = time.time()
        driver = {"cursor": self.cursor, "counters": dict(self.counters),
                  "consumed": self.consumed, "dropped": dict(self.dropped)}
        # unfinished groups are re-run on resume from their index: nothing lost or repeated
        self._learner_call(self.learner.checkpoint.remote(
            str(self.run_dir.checkpoints), self.step, driver, dict(self.done),
            self.cfg.train.keep_checkpoints))
        self.spans.append(Span("checkpoint", "optim", "learner", with_span,
                               time.time() - with_span))


def _placed(place: Callable[[], int], make: Callable[[], Backend]) -> Backend:
    """In a worker's process: its threads and cores first, then its backend loads the model."""
    place()
    return make()


class RunStopped(RuntimeError):
    """The run cannot make progress (its env fails, its groups are all dropped)."""


class LearnerDied(RuntimeError):
    """The learner actor's process is gone; train.py restarts the run from its checkpoint."""


def _cause(err: BaseException) -> str:
    """The exception an actor or task raised, in one line: `Type: message`."""
    inner = getattr(err, "cause", None)
    if isinstance(inner, BaseException) and inner is not err:
        err = inner
    text = " ".join(str(err).split()) or "(no message)"
    return f"{type(err).__name__}: {text[:500]}"


def _parity_config(model_dir: str) -> Any:
    """The model's parity ModelConfig (what node probes run at), or None for other models."""
    from parity.model import ModelConfig, ModelConfigError

    try:
        return ModelConfig.from_pretrained(model_dir)
    except (ModelConfigError, FileNotFoundError):
        return None


def _batch_stats(groups: list[list[Trajectory]]) -> dict[str, float]:
    """Reward, pass rate, each reward component's mean (a rubric's weight-0 criteria
    included: they are logged, not trained on), response length and turns of one batch."""
    trajs = [t for g in groups for t in g]
    n = len(trajs)
    names = sorted({k for t in trajs for k in t.reward_components})
    return {
        "reward/mean": sum(t.reward for t in trajs) / n,
        "reward/pass_rate": pass_rate(trajs),
        **{f"reward/components/{k}": sum(t.reward_components.get(k, 0.0) for t in trajs) / n
           for k in names},
        "response/len_mean": sum(t.num_generated for t in trajs) / n,
        "episode/turns_mean": sum(t.num_turns for t in trajs) / n,
    }


def _samples(groups: list[list[Trajectory]], n: int) -> list[dict[str, Any]]:
    """`n` episodes of a batch to show (`output.samples_per_step`): the first of each
    group, then the second, … so that they span tasks before repeating one."""
    order = [g[i] for i in range(max(map(len, groups), default=0)) for g in groups if i < len(g)]
    return [sample_episode(t) for t in order[:n]]
