"""Engine behaviour: sampling, stops, prefix reuse, preemption, continuations, versions."""

from __future__ import annotations

import asyncio

import pytest
import torch

from parity.engine import Engine, EngineConfig, SamplingParams
from parity.engine.sequence import Status
from parity.engine.shapes import random_model
from parity.model import token_logprobs
from parity.model.layout import attention_scores


class CharTokenizer:
    """One id per character (ids 0..255): the engine's stop strings need only decode."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 101, (length + i,), generator=g).tolist() for i in range(n)]


def test_recorded_logprobs_equal_learner_at_temperature(engine, model):
    prompts = _prompts(3, 20)
    outs = engine.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=10, seed=1))
    for p, c in zip(prompts, outs, strict=True):
        assert c.finish_reason == "length" and len(c.token_ids) == 10
        assert c.versions == [0] * 10
        ref = token_logprobs(model, torch.tensor([p + c.token_ids]), 0.7)[0, len(p) - 1 :]
        assert torch.equal(torch.tensor(c.logprobs, dtype=torch.float32), ref)


def test_greedy_records_temperature_one_logprob_of_argmax(engine, model):
    (p,) = _prompts(1, 12)
    (c,) = engine.generate([p], SamplingParams(temperature=0, max_new_tokens=6))
    toks = torch.tensor([p + c.token_ids])
    with torch.no_grad():
        lp = model.logprobs(model(toks[0], *_dense(len(toks[0]))), 1.0)
    for i, t in enumerate(c.token_ids):
        row = lp[len(p) - 1 + i]
        assert t == int(row.argmax())
        assert c.logprobs[i] == float(row[t])


def _dense(n: int):
    from parity.model import DenseKV, SeqLayout

    return SeqLayout.from_lengths([n]), DenseKV()


def test_seeded_request_draws_the_same_tokens_in_any_batch(engine, model):
    (p,) = _prompts(1, 15, seed=4)
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, seed=123)
    (alone,) = engine.generate([p], sp)
    other = Engine(model, EngineConfig(kv_blocks=256, max_batch_tokens=7))
    many = other.generate(
        [*_prompts(5, 9, seed=5), p], [SamplingParams(max_new_tokens=5)] * 5 + [sp]
    )
    assert many[-1].token_ids == alone.token_ids
    assert many[-1].logprobs == alone.logprobs


def test_top_k_one_and_tiny_top_p_are_greedy(engine):
    (p,) = _prompts(1, 10, seed=2)
    greedy = engine.generate([p], SamplingParams(temperature=0, max_new_tokens=8))[0].token_ids
    for sp in (
        SamplingParams(temperature=1.5, top_k=1, max_new_tokens=8, seed=9),
        SamplingParams(temperature=1.5, top_p=1e-6, max_new_tokens=8, seed=9),
    ):
        assert engine.generate([p], sp)[0].token_ids == greedy


def test_top_k_restricts_the_draw(engine, model):
    (p,) = _prompts(1, 10, seed=3)
    c = engine.generate([p], SamplingParams(temperature=2.0, top_k=3, max_new_tokens=20, seed=5))[0]
    toks = p + c.token_ids
    from parity.model import DenseKV, SeqLayout

    with torch.no_grad():
        lp = model.logprobs(
            model(torch.tensor(toks), SeqLayout.from_lengths([len(toks)]), DenseKV()), 2.0
        )
    for i, t in enumerate(c.token_ids):
        assert t in lp[len(p) - 1 + i].topk(3).indices.tolist()


def test_stop_token_ends_the_turn_and_is_kept(engine):
    (p,) = _prompts(1, 10, seed=6)
    free = engine.generate([p], SamplingParams(temperature=0, max_new_tokens=8))[0].token_ids
    stop = free[3]
    c = engine.generate(
        [p], SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=(stop,))
    )[0]
    assert c.finish_reason == "stop"
    assert c.token_ids == free[: free.index(stop) + 1]


def test_stop_string_needs_detokenization():
    tok = CharTokenizer()
    model = random_model("test", vocab_size=tok.vocab_size)
    eng = Engine(model, EngineConfig(kv_blocks=64), tokenizer=tok)
    p = tok.encode("Q: 12+30=")
    free = eng.generate([p], SamplingParams(temperature=0, max_new_tokens=10))[0].token_ids
    text = tok.decode(free)
    stop = text[4:6]  # a stop string that greedy decoding produces
    c = eng.generate([p], SamplingParams(temperature=0, max_new_tokens=10, stop_strings=(stop,)))[0]
    assert c.finish_reason == "stop"
    assert stop in tok.decode(c.token_ids) and stop not in tok.decode(c.token_ids[:-1])


def test_group_of_samples_shares_the_prompt_kv(model):
    eng = Engine(model, EngineConfig(kv_blocks=128, block_size=16))
    (p,) = _prompts(1, 50, seed=7)
    eng.generate([p] * 4, [SamplingParams(max_new_tokens=4, seed=s) for s in range(4)])
    # 3 full blocks (48 tokens) computed once, then hit by the 3 other samples
    assert eng.num_cached_tokens == 3 * 48


def test_prefix_caching_off_recomputes_the_same_bits(model):
    (p,) = _prompts(1, 50, seed=7)
    params = [SamplingParams(max_new_tokens=4, seed=s) for s in range(4)]
    cached = Engine(model, EngineConfig(kv_blocks=128)).generate([p] * 4, params)
    eng = Engine(model, EngineConfig(kv_blocks=128, prefix_caching=False))
    outs = eng.generate([p] * 4, params)
    assert eng.num_cached_tokens == 0 and not eng.blocks.cached
    assert [o.logprobs for o in outs] == [o.logprobs for o in cached]


def test_prefill_chunks_fit_the_attention_score_budget(model):
    """A prompt is chunked so that each step's scores, as the layout counts them, fit the
    budget; the chunks are the largest that do, and the logprobs stay the learner's."""
    cfg = model.config
    budget = 2**15
    eng = Engine(model, EngineConfig(kv_blocks=64, max_attention_scores=budget))
    (p,) = _prompts(1, 300, seed=3)
    seq = eng.make_sequence(p, SamplingParams(max_new_tokens=2, seed=0))
    eng.add(seq)
    prefill = []
    while seq.num_computed < len(p):
        before = seq.num_computed
        eng.step()
        prefill.append((before, seq.num_computed - before))
    while seq.status is not Status.FINISHED:
        eng.step()
    assert sum(n for _, n in prefill) == len(p) and len(prefill) > 1
    for off, n in prefill:
        cost = attention_scores([n], [off + n], cfg.num_attention_heads, cfg.kv_heads)
        assert cost <= budget
        if off + n < len(p):  # one row more would not have fit
            assert (
                attention_scores([n + 1], [off + n + 1], cfg.num_attention_heads, cfg.kv_heads)
                > budget
            )
    c = seq.completion()
    ref = token_logprobs(model, torch.tensor([p + c.token_ids]), 1.0)[0, len(p) - 1 :]
    assert torch.equal(torch.tensor(c.logprobs, dtype=torch.float32), ref)


def test_multi_turn_continuation_reuses_earlier_turns(model):
    eng = Engine(model, EngineConfig(kv_blocks=128, block_size=16))
    (p,) = _prompts(1, 40, seed=8)
    c1 = eng.generate([p], SamplingParams(max_new_tokens=20, seed=1))[0]
    turn2 = p + c1.token_ids + [5, 6, 7]
    c2 = eng.generate([turn2], SamplingParams(max_new_tokens=5, seed=2))[0]
    # every full block of turn 1 (the last generated token had no K/V yet) is reused
    assert eng.num_cached_tokens == (len(p) + len(c1.token_ids) - 1) // 16 * 16
    ref = token_logprobs(model, torch.tensor([turn2 + c2.token_ids]), 1.0)[0, len(turn2) - 1 :]
    assert torch.equal(torch.tensor(c2.logprobs, dtype=torch.float32), ref)


def test_preemption_recomputes_and_matches_an_unpressured_run(model):
    prompts = _prompts(4, 40, seed=9)
    params = [SamplingParams(max_new_tokens=20, seed=i) for i in range(4)]
    roomy = Engine(model, EngineConfig(kv_blocks=256)).generate(prompts, params)
    tight = Engine(model, EngineConfig(kv_blocks=12, max_batch_tokens=64))
    outs = tight.generate(prompts, params)
    assert tight.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in roomy]
    assert [o.logprobs for o in outs] == [o.logprobs for o in roomy]
    assert tight.blocks.num_free == 12


def test_context_limit_finishes_with_length(model):
    eng = Engine(model, EngineConfig(kv_blocks=64, max_model_len=24))
    c = eng.generate([[1] * 20], SamplingParams(max_new_tokens=50))[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 4


def test_weight_update_versions_tokens_and_refuses_bad_updates(model):
    eng = Engine(model, EngineConfig(kv_blocks=128))
    (p,) = _prompts(1, 10, seed=11)
    sp = SamplingParams(max_new_tokens=10, seed=3)
    seq = eng.make_sequence(p, sp)
    eng.add(seq)
    for _ in range(4):
        eng.step()
    old = {k: v.clone() for k, v in model.state_dict().items()}
    bad = dict(old)
    bad["model.norm.weight"] = torch.ones(3)
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape \(3,\)"):
        eng.update_weights(bad, 1)
    bad["model.norm.weight"] = old["model.norm.weight"].double()
    with pytest.raises(ValueError, match=r"dtype torch\.float64"):
        eng.update_weights(bad, 1)
    with pytest.raises(ValueError, match=r"missing tensors: lm_head\.weight"):
        eng.update_weights({k: v for k, v in old.items() if k != "lm_head.weight"}, 1)
    assert eng.version == 0
    assert all(torch.equal(v, old[k]) for k, v in model.state_dict().items())
    new = {k: v * 1.01 for k, v in old.items()}
    try:
        eng.update_weights(new, 7)
        while eng.scheduler.has_work():
            eng.step()
        c = seq.completion()
        assert eng.version == 7
        assert c.versions == [0] * 4 + [7] * 6
        ref = token_logprobs(model, torch.tensor([p + c.token_ids]), 1.0)[0, len(p) + 3 :]
        assert torch.equal(torch.tensor(c.logprobs[4:], dtype=torch.float32), ref)
    finally:
        model.load_state_dict(old)


def test_agenerate_batches_concurrent_calls_and_cancels_cleanly(model):
    eng = Engine(model, EngineConfig(kv_blocks=256))
    prompts = _prompts(16, 8, seed=12)
    sp = SamplingParams(max_new_tokens=6, seed=0)

    async def main():
        outs = await asyncio.gather(*(eng.agenerate(p, sp) for p in prompts))
        slow = asyncio.create_task(eng.agenerate(prompts[0], SamplingParams(max_new_tokens=200)))
        await asyncio.sleep(0.05)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        return outs

    outs = asyncio.run(main())
    assert all(len(o.token_ids) == 6 for o in outs)
    assert eng.num_steps < 16 * 6  # batched, not one request at a time
    assert eng.blocks.num_free == 256 and not eng.scheduler.has_work()
    assert outs == eng.generate(prompts, sp)


def test_a_thousand_concurrent_episodes(model):
    eng = Engine(model, EngineConfig(kv_blocks=512, max_seqs=256, max_batch_tokens=1024))
    g = torch.Generator().manual_seed(13)
    prompts = torch.randint(0, 101, (1000, 3), generator=g).tolist()

    async def main():
        return await asyncio.gather(
            *(eng.agenerate(p, SamplingParams(max_new_tokens=2)) for p in prompts)
        )

    outs = asyncio.run(main())
    assert [len(o.token_ids) for o in outs] == [2] * 1000
    assert eng.blocks.num_free == 512
