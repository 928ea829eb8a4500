"""Where the learner computes: on its GPU when `learner.num_gpus` > 0, and a learner given a GPU
its process cannot use stops the run with one line naming the key, never training on the CPU
in its place. Ray is told of a GPU this machine does not have, so it places the learner and
makes device 0 visible to it, as on a node whose torch build has no CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import tiny
import torch

from parity.trainer.config import TrainConfig
from parity.trainer.learner_actor import LearnerActor, LearnerDeviceError, ModelIO, learner_device

ray.cloudpickle.register_pickle_by_value(tiny)  # Ray workers cannot import test modules
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
IO = ModelIO(load=tiny.load_tiny, save=tiny.save_tiny, logprobs=tiny.packed_logprobs)
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


def test_a_learner_without_gpus_computes_on_the_cpu() -> None:
    assert learner_device(0) == torch.device("cpu")


@NO_CUDA
def test_a_learner_given_a_gpu_its_torch_cannot_see_stops_naming_the_key(tmp_path: Path) -> None:
    ray.init(num_cpus=1, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        cfg = TrainConfig.model_validate({"learner": {"num_gpus": 1}})
        actor = ray.remote(LearnerActor).options(num_cpus=1, num_gpus=1).remote(
            cfg, IO, str(tmp_path), str(tmp_path))
        with pytest.raises(ray.exceptions.RayActorError) as died:
            ray.get(actor.__ray_ready__.remote(), timeout=120)
    finally:
        ray.shutdown()
    assert str(died.value).splitlines()[-1] == (
        f"parity.trainer.learner_actor.LearnerDeviceError: learner.num_gpus = 1, but torch "
        f"{torch.__version__} in the learner's process sees no CUDA device "
        f"(CUDA_VISIBLE_DEVICES = '0': no GPU or driver there, or a torch build without "
        f"CUDA); set learner.num_gpus = 0 to train on the CPU")
    with pytest.raises(LearnerDeviceError):
        learner_device(0.5)


def test_the_gpu_learner_check_runs_its_steps_on_the_cpu() -> None:
    """`scripts/gpu_learner_check.py --smoke`: the GPU check's learner steps on the CPU and a
    one-rank gloo group (on a GPU it runs them on the device and an NCCL group)."""
    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(repo / "scripts/gpu_learner_check.py"), "--smoke"],
                         capture_output=True, text=True, timeout=300, cwd=repo)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert {k: v for k, v in report.items() if k not in ("torch", "seconds")} == {
        "device": "cpu", "parameters on the device": True, "published on the CPU": True,
        "kl/rollout_learner (first step)": 0.0, "is/d3_mismatch (lagged step)": 0.0,
        "fresh decoder = learner at θ_1": True, "one rank: backend": "gloo",
        "one rank: parameters on the device": True,
        "one rank: logprobs = one learner's at θ_1": True,
        "one rank: is/d3_mismatch (lagged step)": 0.0,
        "one rank: max |θ − one learner's θ| after two steps": 0.0, "ok": True}
