"""`parity eval` measures a checkpoint on as many held-out episodes as its run did, takes
a run directory, env kwargs and `--show`, and turns bad input into one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from parity.core.types import Trajectory
from parity.envs import register_env
from parity.envs.python_tool import PythonToolEnv
from parity.trainer.cli import app
from parity.trainer.config import TrainConfig
from parity.trainer.embedded import EMBEDDED_DIR
from parity.trainer.evaluate import evaluate, pass_rate
from parity.trainer.rundir import RunDir


def _checkpoint(root: Path, heldout_episodes: int) -> Path:
    """A run directory whose config asks for `heldout_episodes`, with the embedded model as
    its latest checkpoint, step 1."""
    run = RunDir(root)
    run.save_config(TrainConfig.model_validate({"eval": {"heldout_episodes": heldout_episodes}}))
    step = root / "checkpoints" / "step_000001"
    shutil.copytree(EMBEDDED_DIR, step / "model")
    (step / "state.pt").write_bytes(b"")
    (root / "checkpoints" / "latest").write_text(step.name)
    return step


def test_eval_runs_as_many_episodes_as_the_run(tmp_path: Path) -> None:
    res = evaluate(_checkpoint(tmp_path / "run", 3))
    assert res["n"] == 3
    assert res["env"] == "parity/PythonTool-v0"
    assert 0.0 <= res["pass_rate"] <= 1.0
    assert res["failures"] == 0


class _BrokenTool(PythonToolEnv):
    """The embedded env, whose tool always fails outside the agent."""

    async def respond(self, text: str):
        raise OSError("no sandbox here")


def test_held_out_failures_are_counted_and_said(tmp_path: Path, capsys) -> None:
    """An episode the env could not run counts as not passed, and the run says how many."""
    register_env("parity/TestBrokenTool-v0", f"{__name__}:_BrokenTool", "a tool that fails")
    res = evaluate(_checkpoint(tmp_path / "run", 3), env_id="parity/TestBrokenTool-v0", n=3)
    assert (res["pass_rate"], res["failures"]) == (0.0, 3)
    assert "parity: held-out: 3 of 3 episodes failed (env_error: 3) outside the agent; they " \
           "count as not passed (failures in the result)" in capsys.readouterr().err


def test_pass_rate_is_the_fraction_with_a_positive_reward() -> None:
    trajs = [Trajectory("g", [1], [0], [0.0], [-1], reward=r, failure=f)
             for r, f in ((1.0, None), (0.5, None), (0.0, None), (-1.0, None), (0.0, "sandbox"))]
    assert pass_rate(trajs) == 2 / 5  # a failed episode counts as not passed


def test_eval_n_overrides_the_run(tmp_path: Path) -> None:
    assert evaluate(_checkpoint(tmp_path / "run", 3), n=2)["n"] == 2


def test_eval_cli_takes_a_run_dir_kwargs_and_shows_episodes(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "run", 3)
    r = CliRunner().invoke(app, ["eval", str(tmp_path / "run"), "--n", "2", "--show", "1",
                                 "--set", "env.kwargs.kinds=['add']", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["n"] == 2 and len(res["samples"]) == 1
    sample = res["samples"][0]
    assert sample["messages"][0]["role"] in ("system", "user")
    assert any("+" in m["content"] for m in sample["messages"] if m["role"] == "user")
    assert sample["expected"] is not None and "reward_components" in sample
    r = CliRunner().invoke(app, ["eval", str(tmp_path / "run"), "--n", "1", "--show", "1"])
    assert r.exit_code == 0, r.output
    assert "--- episode 0 ---" in r.output and "held-out success" in r.output


def test_eval_bad_input_is_one_line(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "run", 3)
    cases = {
        ("--env", "parity/Nope-v0"): "parity eval: env.id: unknown environment 'parity/Nope-v0'",
        ("--set", "env.kwargs.colour=1"): "parity eval: env.kwargs of parity/PythonTool-v0:",
        ("--env", "parity/Math-v0", "--set", "env.kwargs.backend='local'"):
            "parity eval: env.kwargs of parity/Math-v0:",
    }
    for args, start in cases.items():
        r = CliRunner().invoke(app, ["eval", str(tmp_path / "run"), *args])
        assert r.exit_code == 2, (args, r.output)
        assert len(r.output.strip().splitlines()) == 1 and r.output.startswith(start), r.output
    r = CliRunner().invoke(app, ["eval", str(tmp_path / "nothing")])
    assert r.exit_code == 2
    assert r.output.strip() == (f"parity eval: {tmp_path / 'nothing'}: neither a run directory, "
                                f"a checkpoint nor a model directory")
