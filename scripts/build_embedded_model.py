"""Build the embedded default model: tokenizer + tiny Qwen2 warm-started on oracle demos.

    uv run python scripts/build_embedded_model.py            # writes the shipped assets
    uv run python scripts/build_embedded_model.py --steps 50 --out /tmp/m   # a quick try

Tasks, demonstrator choices, initialisation and minibatches all come from fixed seeds and the
thread count is fixed, so the same command on the same machine type is meant to rebuild the
same bits (not yet verified; the shipped build took about 35 minutes on 2 shared cores). Weights are
stored in bfloat16 (under 10 MB) and loaded as float32.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from parity.envs.tokenizer import build_project_tokenizer
from parity.model import Decoder, save_model
from parity.model.shapes import TINY
from parity.trainer.embedded import EMBEDDED_DIR, EMBEDDED_ENV, make_embedded_env
from parity.trainer.warmstart import SFTConfig, demonstrations, sft_loss, train_sft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=EMBEDDED_DIR)
    ap.add_argument("--demos", type=int, default=6000, help="demonstration episodes")
    ap.add_argument("--p-tool", type=float, default=0.4, help="share of demos that use the tool")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    tok = build_project_tokenizer()
    t0 = time.time()
    seeds = list(range(args.seed * 10**6, args.seed * 10**6 + args.demos))
    done = [0]

    def progress(n: int) -> None:
        done[0] += n
        if done[0] % 500 == 0:
            print(f"demos {done[0]}/{len(seeds)} ({time.time() - t0:.0f}s)", flush=True)

    demos = demonstrations(lambda: make_embedded_env(tokenizer=tok), seeds, args.p_tool, progress=progress)
    held_out, train = demos[:256], demos[256:]
    print(f"{len(train)} demos, {sum(len(d.tokens) for d in train)} tokens, {time.time() - t0:.0f}s")

    cfg = TINY.model_copy(update={"vocab_size": tok.vocab_size, "eos_token_id": tok.eos_token_id})
    model = Decoder(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)

    def on_step(step: int, loss: float) -> None:
        if step % 100 == 0 or step == args.steps - 1:
            with torch.no_grad():
                held = float(sft_loss(model, held_out))
            print(f"step {step} loss {loss:.4f} held-out {held:.4f} ({time.time() - t0:.0f}s)", flush=True)

    train_sft(model, train, SFTConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                      seed=args.seed), on_step)
    model.to(torch.bfloat16)
    save_model(model, args.out)
    tok.save(args.out)
    meta = {"env": EMBEDDED_ENV, "demos": args.demos, "p_tool": args.p_tool, "steps": args.steps,
            "batch_size": args.batch_size, "lr": args.lr, "threads": args.threads, "seed": args.seed}
    (args.out / "warmstart.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {args.out} in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
