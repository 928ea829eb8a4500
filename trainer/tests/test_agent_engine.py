"""An OpenAI-SDK agent on the real parity engine and the embedded model: the trajectory's
tokens are the engine's, and the learner recomputes their logprobs bit for bit."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import torch

from parity.core.types import SamplingParams
from parity.engine import Engine, EngineConfig
from parity.envs.registry import make_env
from parity.envs.runner import run_episode
from parity.model import load_model, packed_logprobs
from parity.trainer.embedded import EMBEDDED_DIR

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_python_tool.py"


def test_agent_episode_on_the_engine_is_what_the_learner_scores() -> None:
    spec = importlib.util.spec_from_file_location("agent_python_tool", EXAMPLE)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # registers the env
    model = load_model(EMBEDDED_DIR, kernels="aligned")
    engine = Engine(model, EngineConfig(kv_blocks=512, max_batch_tokens=512))
    stops = tuple(make_env("parity/PythonTool-v0", tokenizer=str(EMBEDDED_DIR)).unwrapped
                  .tokenizer.stop_token_ids)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=64, seed=3, stop_token_ids=stops)

    async def main():
        trajs = []
        for seed in range(4):
            env = make_env("parity/AgentPythonTool-v0", tokenizer=str(EMBEDDED_DIR),
                           task_kwargs={"difficulty": 0, "kinds": ["mul"]})
            trajs.append(await run_episode(env, engine.agenerate, seed=seed, sampling=sampling))
            env.close()
        first = trajs[0]
        prompt_len = first.loss_mask.tolist().index(1)
        direct = await engine.agenerate(first.tokens[:prompt_len].tolist(), sampling)
        return trajs, direct, prompt_len

    trajs, direct, prompt_len = asyncio.run(main())
    assert all(t.failure is None and t.num_turns >= 1 for t in trajs)
    assert any(t.reward == 1.0 for t in trajs)  # the warm-started model solves some
    # the endpoint adds nothing: the first turn is what the engine samples for that prompt
    first = trajs[0]
    assert first.tokens[prompt_len:prompt_len + len(direct.token_ids)].tolist() == direct.token_ids
    # the learner's logprobs of the sampled tokens equal the engine's, bit for bit
    for t in trajs:
        with torch.no_grad():
            lp = packed_logprobs(model, torch.as_tensor(t.tokens, dtype=torch.long), [len(t.tokens)])
        sampled = [i for i, m in enumerate(t.loss_mask) if m]
        assert [lp[i - 1].item() for i in sampled] == [t.logprobs[i] for i in sampled]
