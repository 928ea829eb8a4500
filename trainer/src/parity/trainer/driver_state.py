"""The driver's part of a checkpoint: admission's progress and queue, and the run's counters."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from parity.trainer.admission import AdmissionState


@dataclass
class Counters:
    """The run's event counts, logged as `count/<name>` at every step and in the summary;
    checkpointed, so that they add up across resumes. (The dropped groups are counted by
    admission, which keeps them: `Orchestrator.counts`.)"""

    worker_restarts: int = 0  # rollout workers restarted (died, or hung)
    skipped_nonfinite: int = 0  # updates the learner skipped for a non-finite loss
    learner_restarts: int = 0  # learner actors restarted from a checkpoint
    # 1 once the nodes computed aligned kernels differently (train.node_mismatch = "warn");
    # None until then, and not logged
    node_mismatch: int | None = None

    def as_dict(self) -> dict[str, int]:
        """The counts that are logged, by name."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class DriverState:
    """What a checkpoint keeps of the driver (its file driver.pt)."""

    admission: AdmissionState
    counters: Counters
