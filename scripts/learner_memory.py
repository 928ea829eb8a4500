"""Peak RSS per learner rank for one AdamW update (docs/scaling.md, "Learner ranks").

    uv run python scripts/learner_memory.py --ranks 1
    uv run python scripts/learner_memory.py --ranks 2

Each rank is a process of its own, set up as a learner actor sets itself up (`place_process`,
one thread), in a gloo group when --ranks > 1 (the `ShardedLearner`, FSDP2). The model is
the Qwen2-0.5B shape (494M parameters, 136M of them the tied embedding; --layers cuts it),
fp32, aligned kernels, random weights; the learner is the default config's. One learner of
the whole shape peaks at about 23 GiB. The
batch: --seqs sequences of --tokens random tokens in groups of 2, rewards 0 and 1, whose μ
is the model's own logprobs (a forward before the update, as an aligned rollout's). Prints
each rank's peak RSS (ru_maxrss) in GiB after each of --updates updates that AdamW applied:
the first has no moments yet in its forwards and backwards, later ones hold them throughout.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parity.core.types import Trajectory
from parity.model import Decoder, packed_logprobs
from parity.model.shapes import QWEN2_0_5B
from parity.trainer.config import TrainConfig
from parity.trainer.learner import Learner, LearnerSettings, collate
from parity.trainer.nodes import place_process
from parity.trainer.sharded_learner import ShardedLearner


def _rank(rank: int, args: argparse.Namespace, store: str) -> None:
    place_process(1, [], 1)
    if args.ranks > 1:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                world_size=args.ranks)
    torch.manual_seed(0)
    model = Decoder(QWEN2_0_5B.model_copy(update={"num_hidden_layers": args.layers}), "aligned")
    params = sum(p.numel() for p in model.parameters())
    cls = ShardedLearner if args.ranks > 1 else Learner
    learner = cls(LearnerSettings.of(TrainConfig()), model, packed_logprobs)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, QWEN2_0_5B.vocab_size, (args.tokens,), generator=g).tolist()
            for _ in range(args.seqs)]

    def groups(mu: torch.Tensor) -> list[list[Trajectory]]:
        trajs = [Trajectory(f"g{i // 2}", s, [0] + [1] * (len(s) - 1),
                            [0.0, *m[:len(s) - 1].tolist()], [-1] + [0] * (len(s) - 1),
                            reward=float(i % 2)) for i, (s, m) in enumerate(zip(seqs, mu, strict=True))]
        return [trajs[i:i + 2] for i in range(0, len(trajs), 2)]

    b = collate(groups(torch.zeros(args.seqs, args.tokens)))
    for update in range(1, args.updates + 1):
        metrics = learner.train_step(groups(learner._forward_all(b, learner._micro_batches(b), "μ")))
        assert learner.opt.state and metrics["count/skipped_nonfinite"] == 0  # AdamW stepped
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
        print(f"ranks={args.ranks} rank={rank} params={params / 1e6:.0f}M "
              f"peak RSS after update {update}: {peak:.2f} GiB", flush=True)
    if args.ranks > 1:
        dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--layers", type=int, default=QWEN2_0_5B.num_hidden_layers)
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--updates", type=int, default=2,
                   help="from the second on, AdamW's moments are held through the step")
    args = p.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_rank, args=(args, str(Path(d) / "store")), nprocs=args.ranks)


if __name__ == "__main__":
    main()
