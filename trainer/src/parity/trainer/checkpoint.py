"""Atomic checkpoints: a step's model, optimizer, learner state, and the driver's state.

    checkpoints/step_000010/
        model/          HF safetensors dir (config.json + *.safetensors)
        optimizer.pt    AdamW state (one learner), or
        optimizer/      AdamW state as a learner group's ranks hold it, sharded
                        (torch.distributed.checkpoint: a file per rank and .metadata)
        state.pt        the learner's state: version, RNG states, skipped updates
        driver.pt       the driver's: group cursor, drops, finished groups not yet
                        consumed (the queue), counters (parity.trainer.driver_state)
    checkpoints/latest  name of the newest complete checkpoint

A checkpoint is written under a temporary name and renamed into place, then `latest` is
replaced atomically, so a crash at any moment leaves the previous checkpoint usable. A write
that fails (a full disk, a rank of the group that dies while it writes its shards) removes its
partial directory and raises CheckpointError saying so; partial directories a killed process
left behind are removed on resume (`remove_partial`).

A sharded `optimizer/` is keyed by parameter name and resharded as it loads: a group of any
number of ranks, or one learner, resumes it (`load_optimizer`); a group resumes one
learner's `optimizer.pt` too. Every rank writes its own file, so ranks on several nodes need
the run directory on a filesystem they share.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from parity.trainer.driver_state import DriverState


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (the previous one is intact), or a run directory's
    checkpoints are damaged."""


class CheckpointFormatError(CheckpointError):
    """A checkpoint written by an earlier parity, in a layout this one cannot resume."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: the optimizer's state dict (or the directory of its shards, which
    each learner loads its part of), the learner's state (`Learner.state`: `version`,
    `skipped_nonfinite`, `rng`) and the driver's."""

    path: Path
    optimizer: dict[str, Any] | Path
    learner: dict[str, Any]
    driver: DriverState

    @property
    def model_dir(self) -> Path:
        return self.path / "model"


def partial_dir(root: Path, step: int) -> Path:
    """Where checkpoint `step` is written before it is renamed into place."""
    return root / f".step_{step:06d}.tmp"


def save_checkpoint(root: Path, step: int, *, write_model: Callable[[Path], None],
                    optimizer: dict[str, Any] | Callable[[Path], None],
                    learner: dict[str, Any], driver: DriverState, keep: int) -> Path:
    """Write checkpoint `step` under `root` atomically; keep the newest `keep`. `optimizer`:
    a state dict, or what writes the optimizer's files into the directory it is given (a
    learner group's shards: called first, so the other ranks wait for no more than the
    directory)."""
    name = f"step_{step:06d}"
    final = root / name
    tmp = partial_dir(root, step)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        if callable(optimizer):
            optimizer(tmp)
        write_model(tmp / "model")
        files = (("state.pt", learner), ("driver.pt", driver))
        for file, obj in files if callable(optimizer) else (("optimizer.pt", optimizer), *files):
            buf = io.BytesIO()  # serialised first, so a full disk is an OSError, not torch's
            torch.save(obj, buf)
            (tmp / file).write_bytes(buf.getbuffer())
        _fsync_tree(tmp)
    except Exception as e:
        full = _no_space(e, root)
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            previous = latest_checkpoint(root)
        except CheckpointError:
            previous = None
        kept = f"; {previous} is intact" if previous else ""
        if full:
            raise CheckpointError(f"no space left on device writing checkpoint {tmp}{kept}") from e
        raise CheckpointError(f"writing checkpoint {tmp} failed: {type(e).__name__}: {e}{kept}") from e
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(name)
    os.replace(latest_tmp, root / "latest")
    _prune(root, step, keep)
    return final


def _prune(root: Path, step: int, keep: int) -> None:
    """Keep the newest `keep` checkpoints up to `step`, the one just written among them.
    Any after `step` belong to steps a resume abandoned (the run redoes them), so they go."""
    steps = {p: step_of(p) for p in root.glob("step_*") if p.is_dir()}
    upto = sorted((p for p, s in steps.items() if s <= step), key=steps.__getitem__)
    for old in upto[:-keep] + [p for p, s in steps.items() if s > step]:
        shutil.rmtree(old, ignore_errors=True)


def step_of(path: Path) -> int:
    """The step of a checkpoint directory `step_NNNNNN` (by number: names outgrow 6 digits)."""
    return int(path.name.removeprefix("step_"))


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`; None when the run never wrote one.

    A `latest` that names a missing checkpoint, or checkpoints without a `latest`, is a
    damaged run directory: CheckpointError, never "start from step 0" over what is there."""
    marker = root / "latest"
    if not marker.exists():
        found = sorted(p.name for p in root.glob("step_*") if p.is_dir())
        if found:
            raise CheckpointError(f"{root} holds {', '.join(found)} but no 'latest' file naming "
                                  f"the complete one: the run directory is damaged")
        return None
    name = marker.read_text().strip()
    path = root / name
    if not (name and (path / "state.pt").is_file()):
        raise CheckpointError(f"{marker} names {name!r}, which is not a complete checkpoint "
                              f"in {root}: the run directory is damaged")
    return path


def load_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint at `path`; CheckpointFormatError for one an earlier parity wrote (its driver
    state was in state.pt and queue.pt, with trajectories of another layout)."""
    if (path / "queue.pt").is_file() and not (path / "driver.pt").is_file():
        raise CheckpointFormatError(
            f"{path} was written by an earlier version of parity (queue.pt, no driver.pt) and "
            f"cannot be resumed by this one; its model is intact: start a new run from it with "
            f"--set model.path={path / 'model'}")
    sharded = path / "optimizer"
    if sharded.is_dir() and not (sharded / ".metadata").is_file():
        raise CheckpointError(f"{sharded} has no .metadata: its shards were never completed")
    # driver.pt holds Trajectory dataclasses; only load checkpoints you wrote.
    return Checkpoint(
        path=path,
        optimizer=sharded if sharded.is_dir() else torch.load(path / "optimizer.pt",
                                                              weights_only=False),
        learner=torch.load(path / "state.pt", weights_only=False),
        driver=torch.load(path / "driver.pt", weights_only=False),
    )


def save_optimizer(model: nn.Module, opt: torch.optim.Optimizer, d: Path) -> None:
    """`opt`'s state into directory `d` (torch.distributed.checkpoint), keyed by `model`'s
    parameter names, as this process holds it: in a process group, every rank calls it and
    writes its shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, opt)}, checkpoint_id=d)


def load_optimizer(model: nn.Module, opt: torch.optim.Optimizer, d: Path) -> None:
    """`opt`'s state from `save_optimizer`'s directory `d`, written by any number of ranks,
    in this process's layout (a rank's shards, or whole tensors without a process group)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    state = get_optimizer_state_dict(model, opt)  # makes AdamW's state, for DCP to fill
    with warnings.catch_warnings():  # one learner: no process group, which DCP warns of
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.load({"optimizer": state}, checkpoint_id=d, no_dist=not dist.is_initialized())
    set_optimizer_state_dict(model, opt, state)


def remove_partial(root: Path) -> list[Path]:
    """Remove what an interrupted checkpoint write left under `root`; returns what it removed."""
    gone = [p for p in root.glob(".step_*.tmp")] + [p for p in root.glob(".latest.tmp")]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return gone


def _no_space(err: BaseException, root: Path) -> bool:
    """Whether a failed write ran out of disk: ENOSPC anywhere in the chain, a library's own
    wording of it (safetensors), or almost nothing left where the checkpoint goes."""
    e: BaseException | None = err
    while e is not None:
        if getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e):
            return True
        e = e.__cause__ or e.__context__
    try:
        return shutil.disk_usage(root).free < 1 << 20
    except OSError:
        return False


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
