"""The learner on a GPU: one learner, and a learner rank in an NCCL group, step on the device.

On a GPU machine (torch, triton, numpy, safetensors and pydantic, as `scripts/gpu_check.py`):

    PYTHONPATH=packages/core/src:packages/model/src:packages/engine/src:trainer/src \\
        python scripts/gpu_learner_check.py > gpu_learner.json

Without a GPU, `--smoke` runs the same steps on the CPU with a gloo group
(`trainer/tests/test_learner_device.py` runs it).

The parity decoder (a small random Qwen2 shape, aligned kernels) is moved to the device as
`learner.num_gpus` > 0 moves it (`parity.trainer.learner_actor.learner_device`), and takes
two steps: rollouts whose logprobs are its own θ_0 forward, twice, so the second step's
batch lags a version and the D3 split's shadow forward runs. Asserted: the parameters stay
on the device and the published weights are CPU tensors; the first step's
`kl/rollout_learner` and the lagged step's `is/d3_mismatch` are exactly 0 (the learner
recomputes its own bits, on the device, the shadow included); after the first step a fresh decoder on the device, loaded with the
published weights, computes the learner's θ_1 logprobs bit for bit (no stale prepared
weights). Then a `ShardedLearner` of one rank (FSDP2 over an NCCL group on a GPU) takes the
same steps: its logprobs equal the learner's bit for bit, its weights agree to float32
rounding (the largest difference is reported, at most BOUND). `ok` is whether every
assertion held; the exit status is 0 only then.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

BOUND = 1e-6  # max |θ(one rank) − θ(one learner)| after two steps


def _learner_steps(learner_class: type, device: Any) -> dict[str, Any]:
    import torch

    from parity.core.types import Trajectory
    from parity.model import packed_logprobs
    from parity.model.decoder import Decoder
    from parity.model.shapes import TINY
    from parity.trainer.config import TrainConfig
    from parity.trainer.learner import LearnerSettings, collate

    shape = TINY.model_copy(update={"hidden_size": 64, "intermediate_size": 128,
                                    "num_hidden_layers": 2})
    cfg = LearnerSettings.of(TrainConfig.model_validate(
        {"optim": {"lr": 1e-2, "micro_batch_tokens": 24}, "train": {"max_lag": 2, "mismatch_share": 1.0}}))
    torch.manual_seed(0)
    learner = learner_class(cfg, Decoder(shape, "aligned").to(device), packed_logprobs)
    seqs = [list(range(3, 3 + n)) for n in (17, 5, 30, 9, 12, 2)]
    tokens = torch.tensor([t for s in seqs for t in s], device=device)
    with torch.no_grad():
        mu = packed_logprobs(learner.model, tokens, [len(s) for s in seqs]).cpu().split(
            [len(s) - 1 for s in seqs])
    groups = [[Trajectory("g", s, [0] + [1] * (len(s) - 1), [0.0, *m.tolist()],
                          [-1] + [0] * (len(s) - 1), reward=float(len(s) % 2))
               for s, m in zip(seqs, mu, strict=True)]]
    b = collate(groups)
    first = learner.train_step(groups)
    published = learner.current_weights()
    theta_1 = learner._forward_all(b, learner._micro_batches(b), "θ_1")
    fresh = Decoder(shape, "aligned").to(device)
    fresh.load_state_dict(published)
    fresh_1 = packed_logprobs(fresh, tokens, [len(s) for s in seqs]).detach().cpu()
    lagged = learner.train_step(groups)  # θ_0's rollouts at version 1: the shadow forward
    return {"first": first, "lagged": lagged, "published": published, "θ_1": theta_1,
            "fresh θ_1": fresh_1, "b": b,
            "on device": all(p.device.type == device.type for p in learner.model.parameters()),
            "weights": learner.current_weights()}


def _rows(b: Any, packed: Any) -> Any:
    """Packed logprobs laid into the batch's rows, as the learner lays them."""
    return b.rows(packed, list(range(len(b.lengths))))


def check(device: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from parity.trainer.learner import Learner
    from parity.trainer.sharded_learner import ShardedLearner

    one = _learner_steps(Learner, device)
    report: dict[str, Any] = {
        "parameters on the device": one["on device"],
        "published on the CPU": all(t.device.type == "cpu" for t in one["published"].values()),
        "kl/rollout_learner (first step)": one["first"]["kl/rollout_learner"],
        "is/d3_mismatch (lagged step)": one["lagged"]["is/d3_mismatch"],
        "fresh decoder = learner at θ_1": torch.equal(_rows(one["b"], one["fresh θ_1"]), one["θ_1"]),
    }
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method="tcp://127.0.0.1:29571", rank=0, world_size=1)
    try:
        rank = _learner_steps(ShardedLearner, device)
    finally:
        dist.destroy_process_group()
    diff = max(float((a - rank["weights"][k]).abs().max()) for k, a in one["weights"].items())
    report |= {
        "one rank: backend": backend,
        "one rank: parameters on the device": rank["on device"],
        "one rank: logprobs = one learner's at θ_1": torch.equal(rank["θ_1"], one["θ_1"]),
        "one rank: is/d3_mismatch (lagged step)": rank["lagged"]["is/d3_mismatch"],
        "one rank: max |θ − one learner's θ| after two steps": diff,
    }
    report["ok"] = bool(
        report["parameters on the device"] and report["published on the CPU"]
        and report["kl/rollout_learner (first step)"] == 0 and report["is/d3_mismatch (lagged step)"] == 0
        and report["fresh decoder = learner at θ_1"] and rank["on device"]
        and report["one rank: logprobs = one learner's at θ_1"]
        and report["one rank: is/d3_mismatch (lagged step)"] == 0 and diff <= BOUND)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the same steps on the CPU (gloo)")
    args = parser.parse_args()
    started = time.perf_counter()
    import torch

    from parity.trainer.learner_actor import learner_device

    if not args.smoke and not torch.cuda.is_available():
        print(json.dumps({"ok": False, "refused": "no CUDA device: run with --smoke to check on CPU"}))
        return 1
    device = learner_device(0 if args.smoke else 1)
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, **check(device)}
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=1, ensure_ascii=False))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
