"""The driver: runs `train.steps` updates of the learner on rollout groups.

Each turn of its loop starts what admission allows (parity.trainer.admission: the lag bound,
re-runs, drops), hands the learner the next step's groups once they have all finished, and
handles whichever call finishes first: a group (kept, or dropped), a weight acknowledgement,
or the learner's step, which is followed by a weight sync, the step's record
(parity.trainer.stepmetrics) and, every `train.checkpoint_every` steps, a checkpoint. The
actors, their restarts and hang detection are the fleet's (parity.trainer.fleet).

Episodes that failed outside the agent (`Trajectory.failure`) never train: their group
trains on the rest, or is dropped when too few remain (parity.trainer.failures); a step's
`env/failures/*` count the episodes of every group it consumed, trained on or dropped.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from parity.core.timing import Span
from parity.trainer.admission import Admission, AdmissionSettings
from parity.trainer.checkpoint import Checkpoint
from parity.trainer.config import TrainConfig
from parity.trainer.driver_state import Counters, DriverState
from parity.trainer.errors import cause
from parity.trainer.fleet import Fleet
from parity.trainer.learner_actor import ModelIO
from parity.trainer.rollout import BackendFactory, EpisodeFactory
from parity.trainer.rundir import RunDir
from parity.trainer.stepmetrics import SignalWatch, batch_stats, env_failures, samples, step_record


class Orchestrator:
    """Runs `cfg.train.steps` updates, from checkpoint `resume` if given; see the module
    docstring. `on_step` receives each step's record."""

    def __init__(self, cfg: TrainConfig, run: RunDir, io: ModelIO,
                 backend_factory: BackendFactory, episode_factory: EpisodeFactory,
                 model_dir: str, resume: Checkpoint | None = None,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.cfg = cfg
        self.run_dir = run
        self.on_step = on_step
        self.admission = Admission(AdmissionSettings.of(cfg),
                                   resume.driver.admission if resume else None)
        self.counters = resume.driver.counters if resume else Counters()
        self.fleet = Fleet(cfg, io, backend_factory, episode_factory, model_dir,
                           str(resume.model_dir) if resume else model_dir, self.counters,
                           self.admission.rerun)
        self.step = self.fleet.restore(resume) if resume else 0
        self.signal = SignalWatch(cfg.train.max_steps_without_signal)
        self.spans: list[Span] = []  # this step's, from every actor, as they arrive

    def run(self) -> None:
        """Train to `train.steps`; the actors are gone afterwards, however the run ended."""
        try:
            self._loop()
        finally:
            self.fleet.close()

    def _loop(self) -> None:
        fleet = self.fleet
        fleet.start()
        if self.step > 0:
            self.spans.append(fleet.publish())
        train_ref = None
        stats: dict[str, float] = {}  # what the step in training trains on
        shown: list[dict[str, Any]] = []  # its samples
        wait_start = step_start = time.time()
        while self.step < self.cfg.train.steps:
            self._admit()
            if train_ref is None and self.admission.batch_ready():
                self.spans.append(Span("waiting for data", "learner_wait", "learner",
                                       wait_start, time.time() - wait_start))
                batch = self.admission.take()
                stats = env_failures(batch.episodes, self.step,
                                     self.cfg.train.max_env_failure_frac)
                stats |= batch_stats(batch.groups)
                shown = samples(batch.groups, self.cfg.output.samples_per_step)
                self.signal.check(batch.groups, stats["reward/mean"], self.step)
                train_ref = fleet.learner.train_step.remote(batch.groups)
            ref = fleet.wait([train_ref] if train_ref else [])
            if ref is None:
                continue
            if ref is train_ref:
                train_ref = None
                rec = self._finish_step(ref, stats, shown, step_start)
                step_start = wait_start = time.time()
                if self.on_step:
                    self.on_step(rec)
                if self.step % self.cfg.train.checkpoint_every == 0 or \
                        self.step == self.cfg.train.steps:
                    self._checkpoint()
            else:
                self._collect(ref)

    def _admit(self) -> None:
        """Start groups on workers with room, oldest pending first, within the lag bound."""
        fleet = self.fleet
        while (start := self.admission.place(fleet.load(), fleet.versions())) is not None:
            fleet.run_group(*start)
        fleet.hold(self.admission.held(fleet.load()))

    def _collect(self, ref: Any) -> None:
        """A group or a weight update finished: keep the group, or drop it."""
        outcome = self.fleet.collect(ref)
        if outcome is None:
            return
        g, res = outcome
        if isinstance(res, Exception):  # the episode code raised
            self._drop(g, type(getattr(res, "cause", None) or res).__name__, cause(res))
            return
        self.spans += res.spans
        why = self.admission.finished(g, res.trajectories)
        if why is not None:
            self._drop(g, "env_failures", why)

    def _drop(self, g: int, reason: str, why: str) -> None:
        print(f"parity train: group {g} dropped: {why}", file=sys.stderr)
        self.admission.drop(g, reason, why)

    def _finish_step(self, ref: Any, stats: dict[str, float], shown: list[dict[str, Any]],
                     step_start: float) -> dict[str, Any]:
        """The learner has trained the step: publish its weights, log its samples (`shown`),
        record and spans; returns the record."""
        fleet = self.fleet
        metrics, spans = fleet.learner_call(ref)
        self.spans += spans
        self.spans.append(fleet.publish())
        self.run_dir.log_samples(self.step, shown)
        self.spans += fleet.drain_spans()
        for s in self.spans:  # time counts towards the step in whose window it arrived
            s.step = self.step
        wall = time.time() - step_start
        # the window the actors' exclusive states are clipped to (timing.state_seconds)
        self.spans.append(Span(f"step {self.step}", "step", "driver", step_start, wall,
                               step=self.step))
        self.counters.skipped_nonfinite = int(metrics["count/skipped_nonfinite"])
        rec = step_record(self.step, stats, metrics, self.spans, wall, len(fleet.workers),
                          self.counts())
        self.run_dir.log(rec)
        self.run_dir.log_spans(self.spans)
        self.spans = []
        self.step += 1
        return rec

    def counts(self) -> dict[str, int]:
        """The run's event counts by name: the groups dropped (admission's), then
        `Counters`'."""
        return {"dropped": len(self.admission.state.dropped), **self.counters.as_dict()}

    def _checkpoint(self) -> None:
        """Checkpoint the learner and the driver; unfinished groups are re-run on resume
        from their index: nothing lost or repeated."""
        t0 = time.time()
        state = DriverState(self.admission.saved(), replace(self.counters))
        self.fleet.learner_call(self.fleet.learner.checkpoint.remote(
            str(self.run_dir.checkpoints), self.step, state, self.cfg.train.keep_checkpoints))
        self.spans.append(Span("checkpoint", "checkpoint", "learner", t0, time.time() - t0))
