"""A tiny causal LM with the learner's logprob contract, for learner tests that must not wait
on parity.model (the end-to-end tests use the real model)."""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from parity.core.timing import DECODE, StateClock
from parity.core.types import Completion, SamplingParams, Trajectory

VOCAB = 11


class TinyLM(nn.Module):
    """Embedding, a causal running mean, a tanh layer and a head, all written with
    elementwise ops and inner-dim sums so each position's logits are bit-identical however
    long the sequence is (what "aligned kernels" give the real model)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, 16)
        self.w1 = nn.Parameter(torch.randn(16, 16) / 4)
        self.head = nn.Parameter(torch.randn(VOCAB, 16) / 4)

    def forward(self, tokens: Tensor) -> Tensor:
        e = self.embed(tokens)
        pos = torch.arange(1, tokens.shape[1] + 1, dtype=e.dtype)[None, :, None]
        h = torch.cumsum(e, 1) / pos + e
        h = torch.tanh((h[..., None, :] * self.w1).sum(-1))
        return (h[..., None, :] * self.head).sum(-1)


def token_logprobs(model: nn.Module, tokens: Tensor, temperature: float = 1.0,
                   lengths: Tensor | None = None) -> Tensor:
    """lp[:, t] = log p(tokens[t+1] | tokens[:t+1]) in float64 (row-independent)."""
    logits = model(tokens)[:, :-1].double() / temperature
    return torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]


def packed_logprobs(model: nn.Module, tokens: Tensor, lengths: list[int],
                    temperature: float = 1.0, chunk_size: int | None = None) -> Tensor:
    """The learner's contract (`parity.model.packed_logprobs`): packed sequences in, each
    sequence's n - 1 logprobs out, packed (one forward per sequence; no chunks needed)."""
    seqs = tokens.split(lengths)
    return torch.cat([token_logprobs(model, s[None], temperature)[0] for s in seqs])


def make_group(model: nn.Module, gid: str, seqs: list[list[int]], gen_from: int,
               rewards: list[float], version: int, noise: float = 0.0) -> list[Trajectory]:
    """Trajectories whose μ is the model's own logprob (plus `noise` on every token)."""
    out = []
    for s, r in zip(seqs, rewards, strict=True):
        with torch.no_grad():
            lp = token_logprobs(model, torch.tensor([s]))[0].tolist()
        mask = [0] * gen_from + [1] * (len(s) - gen_from)
        mu = [0.0] + [x + noise if m else 0.0 for x, m in zip(lp, mask[1:], strict=True)]
        out.append(Trajectory(group_id=gid, tokens=s, loss_mask=mask, logprobs=mu,
                              versions=[version if m else -1 for m in mask], reward=r))
    return out


# -- a rollout backend and an episode on the tiny model (real Ray actors run these) -------


def load_tiny(model_dir: str, kernels: str = "aligned") -> TinyLM:
    model = TinyLM()
    p = Path(model_dir) / "model.pt"
    if p.exists():
        model.load_state_dict(torch.load(p))
    return model


def save_tiny(model: nn.Module, model_dir: Path) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    torch.save(model.state_dict(), model_dir / "model.pt")


class TinyBackend:
    """Samples token by token with a full forward; records μ with the learner's own
    function ("aligned") or in float32 ("standard": a different numeric path)."""

    def __init__(self, cfg: Any) -> None:
        self.model = load_tiny(cfg.model.path)
        self.kernels = cfg.model.kernels
        self.version = 0
        self.state_clock: StateClock | None = None  # set by the worker, as for the engine

    async def agenerate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        gen = torch.Generator().manual_seed(sampling.seed or 0)
        seq = list(prompt_ids)
        out, lps, vers = [], [], []
        for _ in range(sampling.max_new_tokens):
            await asyncio.sleep(0)  # let weight updates and other episodes interleave
            with self.state_clock.during(DECODE) if self.state_clock else nullcontext(), \
                    torch.no_grad():
                logits = self.model(torch.tensor([seq]))[0, -1]
                if self.kernels == "aligned":
                    logits = logits.double()
                probs = torch.softmax(logits / sampling.temperature, -1)
                tok = int(torch.multinomial(probs.float(), 1, generator=gen))
                if self.kernels == "aligned":
                    lp = float(token_logprobs(self.model, torch.tensor([[*seq, tok]]),
                                              sampling.temperature)[0, -1])
                else:
                    lp = float(torch.log(probs[tok]))
            seq.append(tok)
            out.append(tok)
            lps.append(lp)
            vers.append(self.version)
            if tok in sampling.stop_token_ids:
                break
        return Completion(out, lps, vers, "length")

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.model.load_state_dict(state_dict)
        self.version = version


def tiny_episodes(cfg: Any) -> Any:
    """Two turns: prompt, model turn, observation token 2, model turn. Reward: fraction of
    generated tokens equal to 3. `env.kwargs.crash_marker`: the first episode to find that
    path missing creates it and kills its worker process (a real crash);
    `env.kwargs.raise_on_task`: that task's episodes raise (bad data);
    `env.kwargs.constant_reward`: every episode scores that (no learning signal);
    `env.kwargs.fail`: {task seed: [kind, ...]}: the first episodes of that task to start
    come back failed with those kinds (Trajectory.failure) and reward 0, as a lost sandbox
    leaves them."""
    marker = cfg.env.kwargs.get("crash_marker")
    bad_task = cfg.env.kwargs.get("raise_on_task")
    constant = cfg.env.kwargs.get("constant_reward")
    fail = {int(k): list(v) for k, v in cfg.env.kwargs.get("fail", {}).items()}

    async def episode(generate: Any, task_seed: int, sampling_seed: int) -> Trajectory:
        kinds = fail.get(task_seed)
        failure = kinds.pop(0) if kinds else None
        if task_seed == bad_task:
            raise ValueError(f"task {task_seed}: row has no field 'question'")
        if marker and not os.path.exists(marker):
            Path(marker).write_text("crashed")
            os._exit(1)
        tokens = [1 + task_seed % 5]
        mask, lps, vers = [0], [0.0], [-1]
        for turn in range(2):
            if turn:
                tokens.append(2)
                mask.append(0)
                lps.append(0.0)
                vers.append(-1)
            sp = SamplingParams(temperature=1.0, max_new_tokens=3, seed=sampling_seed + turn)
            c = await generate(tokens, sp)
            tokens += c.token_ids
            mask += [1] * len(c.token_ids)
            lps += c.logprobs
            vers += c.versions
        gen = [t for t, m in zip(tokens, mask, strict=True) if m]
        reward = sum(t == 3 for t in gen) / len(gen) if constant is None else constant
        return Trajectory(group_id=str(task_seed), tokens=tokens, loss_mask=mask, logprobs=lps,
                          versions=vers, reward=0.0 if failure else reward, num_turns=2,
                          failure=failure)

    return episode
