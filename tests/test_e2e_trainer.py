"""End to end: `parity train` machinery with the real decoder, the real engine, the
Python-tool env (real sandbox) and real Ray, on a small random-weight Qwen2 model.

Asserts what the design promises of the aligned path: every token's version is within
max_lag of the step that trains on it, and the learner's logprobs under the sampling
version equal the engine's recorded μ bit for bit (`is/d3_mismatch == 0`); with standard
kernels the same check shows a non-zero mismatch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # as `parity train` does
ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from parity.envs.tokenizer import build_project_tokenizer
    from parity.model import Decoder, save_model
    from parity.model.shapes import TINY

    tok = build_project_tokenizer()
    cfg = TINY.model_copy(update={"vocab_size": tok.vocab_size, "hidden_size": 64,
                                  "intermediate_size": 128, "num_hidden_layers": 2})
    torch.manual_seed(0)
    model = Decoder(cfg)
    with torch.no_grad():  # N(0, 1) tied embeddings make the model repeat its input with p ≈ 1
        model.model.embed_tokens.weight.normal_(0.0, 0.1)
    d = tmp_path_factory.mktemp("model")
    save_model(model, d)
    tok.save(d)
    return d


def test_chunked_learner_forward_trains_exactly_like_unchunked(model_dir):
    """Long episodes: `optim.chunk_tokens` bounds memory; the logprobs (hence D3 and the
    loss) are bit-identical, the gradient equal up to summation order."""
    from parity.core.types import Trajectory
    from parity.model import load_model, packed_logprobs
    from parity.trainer.config import TrainConfig
    from parity.trainer.learner import Learner, LearnerSettings

    g = torch.Generator().manual_seed(1)
    groups = []
    for k in range(2):
        trajs = []
        for r in range(2):
            n = 40 + 7 * r + 3 * k
            toks = torch.randint(5, 90, (n,), generator=g).tolist()
            mask = [0] * 10 + [1] * (n - 10)
            mu = [0.0] * 10 + (-torch.rand(n - 10, generator=g) * 4).tolist()
            trajs.append(Trajectory(f"g{k}", toks, mask, mu, [-1] * 10 + [0] * (n - 10),
                                    reward=float(r)))
        groups.append(trajs)
    out = []
    for chunk in (None, 16):
        cfg = TrainConfig.model_validate({"optim": {"lr": 1e-2, "chunk_tokens": chunk}})
        learner = Learner(LearnerSettings.of(cfg), load_model(model_dir), packed_logprobs)
        out.append((learner.train_step(groups), learner.weights()))
    (m_full, w_full), (m_chunk, w_chunk) = out
    assert m_full["is/d3"] == m_chunk["is/d3"] and m_full["loss"] == m_chunk["loss"]
    assert m_full["grad/norm"] == pytest.approx(m_chunk["grad/norm"], rel=1e-5)
    for k, v in w_full.items():
        torch.testing.assert_close(v, w_chunk[k], rtol=1e-3, atol=1e-4)  # Adam amplifies ~0 grads


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(model_dir: Path, kernels: str, mode: str):
    from parity.trainer.config import load_train_config

    root = Path(__file__).resolve().parents[1]
    return load_train_config(root / "examples" / "smoke.toml", [
        f'model.path="{model_dir}"', f'model.kernels="{kernels}"', f'train.mode="{mode}"',
        "train.steps=3", "rollout.max_new_tokens=24", "rollout.group_size=2",
        # a random model earns no reward, so the gradient is 0; weight decay still moves
        # the weights every update, which makes the policy lag visible
        "optim.weight_decay=0.1", "optim.lr=0.01",
        "output.plots=false", "output.tensorboard=false",
    ])


@pytest.mark.slow
def test_async_aligned_run_has_zero_mismatch_and_bounded_lag(model_dir, ray_local, tmp_path):
    from parity.trainer.rundir import read_metrics
    from parity.trainer.train import run_training

    cfg = _cfg(model_dir, "aligned", "async")
    summary = run_training(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [0, 1, 2]
    assert all(r["lag/max"] <= cfg.max_lag for r in recs)
    assert all(r["is/d3_mismatch"] == 0.0 for r in recs)  # bit-identical at the same version
    assert recs[0]["is/d3"] == 0.0  # step 0: everything sampled by version 0
    stale = [r for r in recs if r["lag/max"] > 0]
    assert stale and all(r["is/d3_lag"] > 0 and r["is/d3"] > 0 for r in stale)
    assert summary["dropped"] == 0
    # the real engine marks its steps: each actor's exclusive states close every step's wall
    from parity.core.timing import DECODE, ENV_WAIT, PREFILL
    from parity.trainer.profile import profile_run

    rep = profile_run(tmp_path / "run")
    walls = [r["timing/step_s"] for r in recs]
    for st in rep["states"].values():
        assert [sum(v.values()) for v in st["per_step"].values()] == pytest.approx(walls)
    assert {PREFILL, DECODE, ENV_WAIT} <= set(rep["states"]["rollout-0"]["seconds"])
    assert {("turn", "generation"), ("episode", "total")} <= {
        (r["level"], r["what"]) for r in rep["latency"]}


@pytest.mark.slow
def test_standard_kernels_show_mismatch(model_dir, ray_local, tmp_path):
    from parity.trainer.rundir import read_metrics
    from parity.trainer.train import run_training

    run_training(_cfg(model_dir, "standard", "sync"), tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert all(r["lag/max"] == 0.0 for r in recs)
    assert all(r["is/d3_mismatch"] > 0 for r in recs)
    assert all(r["is/d3"] == r["is/d3_mismatch"] for r in recs)


@pytest.mark.slow
def test_sigkill_then_resume_loses_only_uncheckpointed_steps(model_dir, tmp_path):
    """`parity train` killed with SIGKILL after its step-2 checkpoint; `--resume` continues
    with no lost or repeated step."""
    import contextlib
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from parity.trainer.rundir import read_metrics

    root = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    parity = str(Path(sys.executable).parent / "parity")
    args = [parity, "train", str(root / "examples" / "smoke.toml"),
            "--out", str(run), "--set", f'model.path="{model_dir}"', "--set", "train.steps=6",
            "--set", "train.checkpoint_every=2", "--set", "rollout.max_new_tokens=16",
            "--set", "rollout.group_size=2", "--set", "output.plots=false"]
    proc = subprocess.Popen(args, cwd=root, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not (run / "checkpoints" / "latest").exists():
            assert proc.poll() is None, "parity train exited before its first checkpoint"
            assert time.time() < deadline, "no checkpoint within 240 s"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # Ray processes it started, if any survive
    ckpt = (run / "checkpoints" / "latest").read_text().strip()
    done = int(ckpt.split("_")[1])
    r = subprocess.run([parity, "train", "--resume", str(run)],
                       cwd=root, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    steps = [rec["step"] for rec in read_metrics(run)]
    assert steps == list(range(6)), steps
    assert done >= 2
    assert json.loads((run / "summary.json").read_text())["steps"] == 6
