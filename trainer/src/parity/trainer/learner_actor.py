"""The learner as a Ray actor: it owns the Learner, puts weights in the object store, and
writes checkpoints that are complete model directories."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity.core.timing import CHECKPOINTING, PUBLISHING, Span
from parity.core.types import Trajectory
from parity.trainer.checkpoint import Checkpoint, save_checkpoint
from parity.trainer.config import TrainConfig
from parity.trainer.driver_state import DriverState
from parity.trainer.learner import Learner, LearnerSettings, LogprobFn
from parity.trainer.nodes import place_process

if TYPE_CHECKING:
    import torch

TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "vocab.", "merges.txt", "chat_template",
                   "added_tokens", "generation_config")


@dataclass
class ModelIO:
    """How the learner loads, saves and scores the policy (parity.model by default)."""

    load: Callable[[str, str], Any]  # (model dir, kernels) -> nn.Module
    save: Callable[[Any, Path], None]  # (model, dir): HF safetensors dir
    logprobs: LogprobFn


class LearnerDeviceError(RuntimeError):
    """The learner was given GPUs (learner.num_gpus > 0) that its process cannot use."""


def learner_device(num_gpus: float) -> torch.device:
    """Where the learner computes: the first of its GPUs when `learner.num_gpus` > 0 (Ray
    makes an actor's GPUs its only visible ones, so that is cuda:0), else the CPU. Weights
    leave it as CPU tensors either way (publishing, checkpoints)."""
    import torch

    if not num_gpus:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise LearnerDeviceError(
            f"learner.num_gpus = {num_gpus:g}, but torch {torch.__version__} in the learner's "
            f"process sees no CUDA device (CUDA_VISIBLE_DEVICES = "
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r}: no GPU or driver there, or "
            f"a torch build without CUDA); set learner.num_gpus = 0 to train on the CPU")
    torch.cuda.set_device(0)
    return torch.device("cuda", 0)


class LearnerActor:
    """The learner as a Ray actor; weights leave it through the object store. It loads
    `load_dir` (the run's model, or the checkpoint it resumes from); checkpoints take their
    tokenizer files from `model_dir`, the run's own model, which is never deleted."""

    learner_class: type[Learner] = Learner  # a rank of a group: ShardedLearner

    def __init__(self, cfg: TrainConfig, io: ModelIO, load_dir: str, model_dir: str) -> None:
        import torch

        lc = cfg.learner
        place_process(lc.num_threads, lc.cpu_affinity, lc.num_cpus)
        torch.manual_seed(cfg.train.seed)  # this process's RNG: seeded here, saved by the learner
        self.cfg = cfg
        self.io = io
        self.model_dir = Path(model_dir)
        model = io.load(load_dir, cfg.model.kernels).to(learner_device(lc.num_gpus))
        self.learner = self.learner_class(LearnerSettings.of(cfg), model, io.logprobs)

    def node_probe(self, model_config: Any) -> dict[str, Any]:
        """The learner's process: its aligned kernels' fingerprint (parity.trainer.nodes)."""
        from parity.trainer.nodes import local_probe

        return local_probe(model_config)

    def placement(self) -> dict[str, Any]:
        """Where this process runs: Ray node, torch threads, CPU cores."""
        from parity.trainer.nodes import here

        return here()

    def restore(self, ckpt: Checkpoint) -> int:
        self.learner.load_state(ckpt.learner, ckpt.optimizer)
        return self.learner.version

    def train_step(self, groups: list[list[Trajectory]]) -> tuple[dict[str, float], list[Span]]:
        metrics = self.learner.train_step(groups)
        return metrics, self.learner.timeline.drain()

    def drain_spans(self) -> list[Span]:
        """The learner's spans so far, its current state's stretch up to now included."""
        self.learner.clock.cut()
        return self.learner.timeline.drain()

    def publish(self) -> tuple[list[Any], int, float]:
        """Put the current weights in the object store: ([ref], version, seconds)."""
        import ray

        t0 = time.time()
        with self.learner.clock.during(PUBLISHING):
            ref = ray.put(self.learner.current_weights())
        return [ref], self.learner.version, time.time() - t0

    def checkpoint(self, root: str, step: int, driver: DriverState, keep: int) -> str:
        """Write checkpoint `step` under `root`: this learner's model, optimizer and state,
        and the driver's `driver`; keep the newest `keep`. Returns its path."""
        with self.learner.clock.during(CHECKPOINTING):
            path = save_checkpoint(
                Path(root), step, write_model=lambda d: self._write_model(self.learner.model, d),
                optimizer=self.learner.opt.state_dict(),
                learner=self.learner.state(), driver=driver, keep=keep)
        return str(path)

    def _write_model(self, model: Any, d: Path) -> None:
        """`model` into `d` as a complete model dir: its weights and the run's tokenizer."""
        self.io.save(model, d)
        for f in self.model_dir.iterdir():
            if f.is_file() and f.name.startswith(TOKENIZER_FILES):
                shutil.copy2(f, d / f.name)
