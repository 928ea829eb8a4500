"""`parity eval` measures a checkpoint on as many held-out episodes as its run did."""

from __future__ import annotations

import shutil
from pathlib import Path

from parity.trainer.config import TrainConfig
from parity.trainer.embedded import EMBEDDED_DIR
from parity.trainer.evaluate import evaluate
from parity.trainer.rundir import RunDir


def _checkpoint(root: Path, heldout_episodes: int) -> Path:
    """A run directory whose config asks for `heldout_episodes`, with the embedded model as
    its step-1 checkpoint."""
    run = RunDir(root, tensorboard=False)
    run.save_config(TrainConfig.model_validate({"eval": {"heldout_episodes": heldout_episodes}}))
    step = root / "checkpoints" / "step_1"
    shutil.copytree(EMBEDDED_DIR, step / "model")
    return step


def test_eval_runs_as_many_episodes_as_the_run(tmp_path: Path) -> None:
    res = evaluate(_checkpoint(tmp_path / "run", 3))
    assert res["n"] == 3
    assert res["env"] == "parity/PythonTool-v0"
    assert 0.0 <= res["pass_rate"] <= 1.0


def test_eval_n_overrides_the_run(tmp_path: Path) -> None:
    assert evaluate(_checkpoint(tmp_path / "run", 3), n=2)["n"] == 2
