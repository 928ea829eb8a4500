"""Config validation, run-dir outputs, time spans, the Chrome trace, profile and the CLI."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from parity.core.config import ConfigError
from parity.core.timing import (
    DECODE,
    FORWARD,
    IDLE,
    WAITING,
    Span,
    Timeline,
    read_spans,
    step_seconds,
    write_spans,
)
from parity.core.trace import chrome_trace
from parity.trainer.admission import AdmissionState
from parity.trainer.checkpoint import (
    CheckpointError,
    CheckpointFormatError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from parity.trainer.cli import app
from parity.trainer.config import TrainConfig, load_train_config
from parity.trainer.driver_state import Counters, DriverState
from parity.trainer.profile import profile_run
from parity.trainer.rundir import RunDir, clear_run, holds_run, read_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_unknown_key_and_wrong_type_name_the_key(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[optim]\nlr = 1e-3\nlearning_rate = 2\n")
    with pytest.raises(ConfigError, match=r"optim.learning_rate: unknown key"):
        load_train_config(p)
    with pytest.raises(ConfigError, match=r"loss.is_mode"):
        load_train_config(None, ["loss.is_mode=clip"])
    with pytest.raises(ConfigError, match=r"rollout.group_size"):
        load_train_config(None, ["rollout.group_size=zero"])
    with pytest.raises(ConfigError, match="icepop_lo"):
        load_train_config(None, ["loss.icepop_lo=3.0"])


def test_overrides_and_sync_mode_lag() -> None:
    cfg = load_train_config(None, ["optim.lr=3e-4", "train.mode=sync", "train.max_lag=8"])
    assert cfg.optim.lr == 3e-4
    assert cfg.max_lag == 0
    assert load_train_config(None, ["train.max_lag=8"]).max_lag == 8


def test_the_trust_region_bound_follows_the_mode_unless_set(tmp_path: Path) -> None:
    """optim.max_update_kl unset: 0.1 when updates lag, off in sync (or at lag 0); a saved
    config keeps it unset, so a run resumed in the other mode gets that mode's bound."""
    assert TrainConfig().max_update_kl == 0.1  # the learner's reading: test_learner.py
    run = RunDir(tmp_path)
    run.save_config(TrainConfig())
    assert "max_update_kl" not in tomllib.loads(run.config_path.read_text())["optim"]
    assert load_train_config(run.config_path, ['train.mode="sync"']).max_update_kl == 0.0
    run.save_config(load_train_config(None, ['train.mode="sync"', "optim.max_update_kl=0.3"]))
    assert load_train_config(run.config_path, ['train.mode="async"']).max_update_kl == 0.3


def test_env_kwargs_change_the_embedded_default_unless_an_env_is_named(tmp_path: Path) -> None:
    """`--set env.kwargs.backend=...` on the default job keeps its task settings (replacing
    them gave tasks the embedded model cannot solve: a run with reward 0 at every step)."""
    cfg = load_train_config(None, ['env.kwargs.backend="docker"'])
    assert cfg.env.kwargs == {"difficulty": 0, "kinds": ["mul"], "backend": "docker"}
    file = tmp_path / "job.toml"
    file.write_text('[env]\nkwargs = { persistent = true }\n')
    assert load_train_config(file).env.kwargs == {"difficulty": 0, "kinds": ["mul"],
                                                  "backend": "local", "persistent": True}
    named = load_train_config(None, ['env.id="parity/PythonTool-v0"', "env.kwargs.difficulty=2"])
    assert named.env.kwargs == {"difficulty": 2}  # a named env gets only the kwargs given
    file.write_text('[env]\nid = "parity/Math-v0"\nkwargs = { split = "test" }\n')
    assert load_train_config(file).env.kwargs == {"split": "test"}


def test_a_named_env_without_kwargs_gets_none_of_the_defaults(tmp_path: Path) -> None:
    """Naming an env.id, in the file or with --set, drops the embedded env's kwargs (Math
    has no `kinds` or `backend`)."""
    math = load_train_config(None, ['env.id="parity/Math-v0"'])
    assert math.env.kwargs == {}
    run = RunDir(tmp_path / "run")
    run.save_config(math)  # empty kwargs write nothing: resuming must not give it the default's
    assert load_train_config(run.config_path) == math
    file = tmp_path / "job.toml"
    file.write_text('[env]\nid = "parity/Math-v0"\n')
    assert load_train_config(file).env.kwargs == {}
    file.write_text('[env]\nkwargs = { persistent = true }\n')
    assert load_train_config(file, ['env.id="parity/Math-v0"']).env.kwargs == {"persistent": True}
    # the file names the env; --set changes one of its kwargs, not the embedded env's
    file.write_text('[env]\nid = "parity/Math-v0"\nkwargs = { split = "test" }\n')
    assert load_train_config(file, ['env.kwargs.turns=2']).env.kwargs == {"split": "test", "turns": 2}
    assert load_train_config(None, ["env.task_seed=3"]).env.kwargs == {
        "difficulty": 0, "kinds": ["mul"], "backend": "local"}  # no env named: the default's


def test_example_configs_validate() -> None:
    for p in sorted(EXAMPLES.glob("*.toml")):
        load_train_config(p)


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_train_config(None, ["loss.gate_kl=0.5", "env.kwargs.difficulty=2"])
    run = RunDir(tmp_path)
    run.save_config(cfg)
    again = load_train_config(run.config_path)
    assert again == cfg
    assert tomllib.loads(run.config_path.read_text())["loss"]["gate_kl"] == 0.5


def test_timeline_spans_trace_and_step_breakdown(tmp_path: Path) -> None:
    tl = Timeline("rollout-0")
    tl.step = 3
    tl.add("generate", "gen", 100.0, 2.0, episode="g0-0", turn=0)
    tl.add("env step", "env", 102.0, 0.5, episode="g0-0", turn=0)
    with tl.span("update", "sync", version=4) as extra:
        extra["bytes"] = 10
    with pytest.raises(ValueError, match="unknown category"):
        tl.add("x", "thinking", 0.0, 1.0)
    spans = tl.drain()
    assert tl.drain() == []
    assert spans[2].args == {"version": 4, "bytes": 10}
    secs = step_seconds([*spans, Span("e", "episode", "rollout-0", 100.0, 2.5, step=3)])
    assert secs[3]["gen"] == 2.0 and secs[3]["env"] == 0.5 and "episode" not in secs[3]
    trace = chrome_trace([*spans[:2], Span("fwd", "learner_fwd", "learner", 101.0, 1.0)])
    meta = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert sorted(meta.values()) == ["learner", "rollout-0"]
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    gen = next(e for e in xs if e["name"] == "generate")
    assert gen["ts"] == 0.0 and gen["dur"] == 2e6 and gen["args"]["turn"] == 0
    assert meta[next(e for e in xs if e["name"] == "fwd")["pid"]] == "learner"
    write_spans(spans, tmp_path / "s.jsonl")
    with open(tmp_path / "s.jsonl", "a") as f:
        f.write('{"name": "torn')  # a crash mid-write
    assert [s.name for s in read_spans(tmp_path / "s.jsonl")] == [s.name for s in spans]


def _fake_run(root: Path, steps: int = 3) -> RunDir:
    run = RunDir(root)
    for k in range(steps):
        run.log({"step": k, "reward/mean": 0.1 * k, "reward/pass_rate": 0.1, "is/d3": 0.0,
                 "timing/step_s": 2.0, "timing/gen_s": 1.5, "timing/learner_s": 0.5})
        run.log_spans([Span("generate", "gen", "rollout-0", 10.0 * k, 1.5, step=k,
                            episode=f"g{k}", turn=0),
                       Span("forward", "learner_fwd", "learner", 10.0 * k + 1.5, 0.5, step=k),
                       Span("wait", "learner_wait", "learner", 10.0 * k, 1.5, step=k),
                       Span(WAITING, "state", "learner", 10.0 * k, 1.5, step=k),
                       Span(FORWARD, "state", "learner", 10.0 * k + 1.5, 0.5, step=k),
                       Span(DECODE, "state", "rollout-0", 10.0 * k, 1.5, step=k),
                       Span(IDLE, "state", "rollout-0", 10.0 * k + 1.5, 0.5, step=k),
                       Span(f"step {k}", "step", "driver", 10.0 * k, 2.0, step=k)])
    return run


def test_profile_breakdown_and_summary(tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    summary = run.finish({"mode": "async"})
    assert summary["steps"] == 3 and summary["steps_s"] == 6.0
    assert summary["updates_per_hour"] == pytest.approx(1800.0)
    assert summary["reward/last"] == pytest.approx(0.2)
    assert json.loads((tmp_path / "summary.json").read_text())["mode"] == "async"
    assert (tmp_path / "plots" / "timing.png").stat().st_size > 0
    rep = profile_run(tmp_path)
    assert rep["actor_seconds"]["gen"]["total_s"] == pytest.approx(4.5)
    assert rep["actor_seconds"]["gen"]["x_wall"] == pytest.approx(0.75)
    assert rep["states"]["learner"]["share"] == pytest.approx({WAITING: 0.75, FORWARD: 0.25})
    assert rep["states"]["rollout-0"]["share"] == pytest.approx({DECODE: 0.75, IDLE: 0.25})
    assert rep["utilisation"] == pytest.approx({"learner": 0.25, "rollout-0": 0.75})
    assert rep["slowest_turns"][0]["gen"] == pytest.approx(1.5)


def test_truncate_from_forgets_redone_steps(tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    run.truncate_from(1)
    assert [r["step"] for r in read_metrics(tmp_path)] == [0]
    assert {s.step for s in read_spans(run.spans_path)} == {0}


def test_checkpoint_is_atomic_and_keeps_newest(tmp_path: Path) -> None:
    def write_model(d: Path) -> None:
        d.mkdir()
        (d / "config.json").write_text("{}")

    driver = DriverState(AdmissionState(cursor=9, consumed=6, dropped={3: "ValueError"},
                                        done={7: []}), Counters(worker_restarts=1))
    for step in (2, 4, 6):
        save_checkpoint(tmp_path, step, write_model=write_model, optimizer={"s": step},
                        learner={"version": step}, driver=driver, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000004", "step_000006"]
    ck = load_checkpoint(latest_checkpoint(tmp_path))
    assert ck.optimizer == {"s": 6} and ck.learner == {"version": 6} and ck.driver == driver
    assert (ck.model_dir / "config.json").exists()
    # a crash while writing step 8 leaves a temp dir and the previous checkpoint usable
    (tmp_path / ".step_000008.tmp").mkdir()
    assert latest_checkpoint(tmp_path).name == "step_000006"


def test_cli_profile_and_config_errors(tmp_path: Path) -> None:
    _fake_run(tmp_path / "run")
    r = CliRunner().invoke(app, ["profile", str(tmp_path / "run"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["steps"] == 3
    r = CliRunner().invoke(app, ["profile", str(tmp_path / "nothing")])
    assert r.exit_code == 2 and "no metrics.jsonl" in r.output
    r = CliRunner().invoke(app, ["train", "--set", "optim.lrr=1", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "optim.lrr: unknown key" in r.output
    assert TrainConfig().train.mode == "async"


def _write_model(d: Path) -> None:
    d.mkdir()
    (d / "config.json").write_text("{}")


NO_DRIVER = DriverState(AdmissionState(), Counters())  # a run that has not started a group


def test_a_checkpoint_of_an_earlier_layout_is_refused_naming_its_model(tmp_path: Path) -> None:
    old = tmp_path / "step_000004"
    (old / "model").mkdir(parents=True)
    for name in ("optimizer.pt", "state.pt", "queue.pt"):  # the layout before driver.pt
        torch.save({}, old / name)
    with pytest.raises(CheckpointFormatError) as e:
        load_checkpoint(old)
    assert str(e.value) == (
        f"{old} was written by an earlier version of parity (queue.pt, no driver.pt) and cannot "
        f"be resumed by this one; its model is intact: start a new run from it with "
        f"--set model.path={old / 'model'}")


def test_pruning_keeps_the_checkpoint_just_written(tmp_path: Path) -> None:
    """Checkpoints after the one written belong to abandoned steps: they go, never it."""
    for step in (4, 6):
        save_checkpoint(tmp_path, step, write_model=_write_model, optimizer={}, learner={},
                        driver=NO_DRIVER, keep=2)
    save_checkpoint(tmp_path, 1, write_model=_write_model, optimizer={}, learner={},
                    driver=NO_DRIVER, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000001"]
    assert latest_checkpoint(tmp_path).name == "step_000001"
    # step numbers compare as numbers once they outgrow six digits
    for step in (999_999, 1_000_000):
        save_checkpoint(tmp_path, step, write_model=_write_model, optimizer={}, learner={},
                        driver=NO_DRIVER, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_1000000", "step_999999"]


def test_a_latest_that_names_nothing_is_an_error(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 2, write_model=_write_model, optimizer={}, learner={},
                    driver=NO_DRIVER, keep=2)
    (tmp_path / "latest").write_text("step_000004")
    with pytest.raises(CheckpointError) as e:
        latest_checkpoint(tmp_path)
    assert str(e.value) == (f"{tmp_path / 'latest'} names 'step_000004', which is not a "
                            f"complete checkpoint in {tmp_path}: the run directory is damaged")
    (tmp_path / "latest").unlink()
    with pytest.raises(CheckpointError) as e:
        latest_checkpoint(tmp_path)
    assert str(e.value) == (f"{tmp_path} holds step_000002 but no 'latest' file naming the "
                            f"complete one: the run directory is damaged")
    assert latest_checkpoint(tmp_path / "empty") is None


def test_out_never_trains_into_a_run_without_resume_or_force(tmp_path: Path) -> None:
    """`--out` onto a run: exit 2 naming what is there, nothing written; `--force` deletes
    the run's own files only; `--resume` of a damaged directory is an error, not step 0."""
    run = _fake_run(tmp_path / "run")
    run.save_config(TrainConfig())
    save_checkpoint(run.checkpoints, 2, write_model=_write_model, optimizer={}, learner={},
                    driver=NO_DRIVER, keep=2)
    (tmp_path / "run" / "notes.txt").write_text("mine")
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    r = CliRunner().invoke(app, ["train", "examples/smoke.toml", "--out", str(tmp_path / "run"),
                                 "--set", "train.steps=1"])
    assert r.exit_code == 2
    assert r.output.strip() == (
        f"parity train: --out {tmp_path / 'run'} holds a run (3 steps logged, checkpoints "
        f"step_000002); continue it with: parity train --resume {tmp_path / 'run'}, or start "
        f"over with --force (deletes that run), or pick another --out")
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before
    assert clear_run(tmp_path / "run") == ["config.toml", "metrics.jsonl", "spans.jsonl",
                                           "checkpoints"]
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["notes.txt"]
    assert not holds_run(tmp_path / "run")
    # a resume whose `latest` names a missing checkpoint stops, saying so
    run = _fake_run(tmp_path / "damaged")
    run.save_config(TrainConfig())
    (run.checkpoints / "latest").write_text("step_000006")
    r = CliRunner().invoke(app, ["train", "--resume", str(tmp_path / "damaged")])
    assert r.exit_code == 1
    assert "names 'step_000006', which is not a complete checkpoint" in r.output
    assert [x["step"] for x in read_metrics(tmp_path / "damaged")] == [0, 1, 2]
