"""The embedded default's warm start: supervised fine-tuning on oracle demonstrations.

Demonstrations are real episodes of the environment (real sandbox, real renderer) played
by a demonstrator that uses the tool with probability `p_tool` and otherwise answers at
once from memory (the right answer, which a model this small rarely reproduces). The
warm-started model therefore uses the tool only some of the time: reinforcement learning
has visible room to teach it to use the tool every time.

Training uses the learner's own `packed_logprobs` (aligned kernels), a fixed seed and a
fixed thread count, so that the same script on the same machine type can rebuild the same
bits (not yet verified: a rebuild takes about 35 minutes on 2 cores).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from parity.core.types import Trajectory
from parity.model import Decoder, packed_logprobs
from parity.model.batch import collate
from parity.trainer.loss import lr_at

if TYPE_CHECKING:
    from parity.envs.core import TextEnv


@dataclass
class SFTConfig:
    steps: int = 3000
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.01
    seed: int = 0


def _answer_at_once(env: TextEnv) -> str:
    """The right answer with no tool call: what the model has to recall from memory."""
    return f"<ans>{env.episode.task['answer']}</ans>"


async def _collect(make_env: Callable[[], Any], seeds: list[int], p_tool: float, concurrency: int,
                   progress: Callable[[int], None]) -> list[Trajectory]:
    from parity.envs.runner import oracle_generate, run_episode

    rng = random.Random(seeds[0] if seeds else 0)
    plan = [(s, rng.random() < p_tool) for s in seeds]
    out: list[Trajectory | None] = [None] * len(plan)
    queue = list(enumerate(plan))

    async def worker() -> None:
        env = make_env()
        try:
            while queue:
                i, (seed, use_tool) = queue.pop()
                play = oracle_generate(env, None if use_tool else _answer_at_once)
                out[i] = await run_episode(env, play, seed=seed)
                progress(1)
        finally:
            env.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [t for t in out if t is not None]


def demonstrations(make_env: Callable[[], Any], seeds: list[int], p_tool: float,
                   concurrency: int = 8, progress: Callable[[int], None] = lambda _: None,
                   ) -> list[Trajectory]:
    """One demonstration episode per seed, each a token-level Trajectory with its loss mask."""
    return asyncio.run(_collect(make_env, seeds, p_tool, concurrency, progress))


def sft_loss(model: Decoder, demos: list[Trajectory]) -> torch.Tensor:
    """Mean negative log-likelihood of the model-written tokens of `demos`."""
    b = collate(demos)
    lp = b.rows(packed_logprobs(model, b.tokens, b.lengths.tolist()))
    return -(lp * b.mask).sum() / b.mask.sum()


def train_sft(model: Decoder, demos: list[Trajectory], cfg: SFTConfig,
              on_step: Callable[[int, float], None] = lambda *_: None) -> None:
    """AdamW with linear warmup and cosine decay over `cfg.steps` minibatches."""
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=(0.9, 0.98))

    model.train()
    for step in range(cfg.steps):
        idx = torch.randint(len(demos), (cfg.batch_size,), generator=gen).tolist()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr, "cosine", cfg.warmup, 0.0)
        loss = sft_loss(model, [demos[i] for i in idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        on_step(step, loss.item())
