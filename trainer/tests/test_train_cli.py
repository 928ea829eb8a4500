"""`parity train` as a user runs it, in its own process: `--ray-address` to a cluster that
does not answer fails within train.start_timeout_s in one line naming the address (nothing
listening there, or something silent); Ctrl-C says where the run stopped and how to resume."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

PARITY = Path(sys.executable).parent / "parity"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _train(address: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PARITY, "train", EXAMPLES / "smoke.toml", "--ray-address", address, "--out", out,
         "--set", "train.start_timeout_s=3", "--set", "eval.heldout_episodes=0"],
        capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("silent", [False, True], ids=["refused", "silent"])
def test_an_unreachable_cluster_fails_in_one_line(tmp_path: Path, silent: bool) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        if silent:  # accepts connections and never answers
            listener.listen(64)
        else:
            listener.close()  # nothing listens: refused
        r = _train(f"127.0.0.1:{port}", tmp_path / "run")
    assert r.returncode == 1, r.stderr
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("parity train:")]
    why = ("(its port answers, Ray does not)" if silent
           else f"(127.0.0.1:{port}: [Errno 111] Connection refused)")
    assert ours == [f"parity train: the Ray cluster at --ray-address 127.0.0.1:{port} did not "
                    f"answer within train.start_timeout_s = 3 s {why} (traceback: "
                    f"{tmp_path / 'run' / 'error.log'})"]


def test_ctrl_c_says_where_the_run_stopped_and_how_to_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    p = subprocess.Popen(
        [PARITY, "train", EXAMPLES / "smoke.toml", "--out", run, "--set", "train.steps=50",
         "--set", "eval.heldout_episodes=0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = run / "metrics.jsonl"
    while not metrics.exists() or len(metrics.read_text().splitlines()) < 3:
        assert p.poll() is None, p.communicate()
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)  # what Ctrl-C sends
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    done = len(metrics.read_text().splitlines())
    latest = (run / "checkpoints" / "latest").read_text()
    assert err.splitlines()[-1] == (
        f"parity train: interrupted; {done} of 50 steps logged, last checkpoint "
        f"{run / 'checkpoints' / latest}; resume with: parity train --resume {run}")
