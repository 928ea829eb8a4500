"""Atomic checkpoints: a step's model, optimizer, RNG, data cursor, version and queue.

    checkpoints/step_000010/
        model/          HF safetensors dir (config.json + *.safetensors)
        optimizer.pt    AdamW state
        state.pt        version, data cursor, RNG states, counters
        queue.pt        finished, not yet consumed rollout groups
    checkpoints/latest  name of the newest complete checkpoint

A checkpoint is written under a temporary name and renamed into place, then `latest` is
replaced atomically, so a crash at any moment leaves the previous checkpoint usable.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class Checkpoint:
    """A loaded checkpoint. `state` holds `version`, `cursor` (next group index to start),
    `rng` and `counters`; `queue` the saved groups (lists of Trajectory)."""

    path: Path
    optimizer: dict[str, Any]
    state: dict[str, Any]
    queue: list[Any]

    @property
    def model_dir(self) -> Path:
        return self.path / "model"


def save_checkpoint(root: Path, step: int, *, write_model: Callable[[Path], None],
                    optimizer: dict[str, Any], state: dict[str, Any], queue: list[Any],
                    keep: int) -> Path:
    """Write checkpoint `step` under `root` atomically; keep the newest `keep`."""
    name = f"step_{step:06d}"
    final = root / name
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_model(tmp / "model")
    torch.save(optimizer, tmp / "optimizer.pt")
    torch.save(state, tmp / "state.pt")
    torch.save(queue, tmp / "queue.pt")
    _fsync_tree(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(name)
    os.replace(latest_tmp, root / "latest")
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    marker = root / "latest"
    if not marker.exists():
        return None
    path = root / marker.read_text().strip()
    return path if path.is_dir() else None


def load_checkpoint(path: Path) -> Checkpoint:
    # queue.pt holds Trajectory dataclasses; only load checkpoints you wrote.
    return Checkpoint(
        path=path,
        optimizer=torch.load(path / "optimizer.pt", weights_only=False),
        state=torch.load(path / "state.pt", weights_only=False),
        queue=torch.load(path / "queue.pt", weights_only=False),
    )


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
