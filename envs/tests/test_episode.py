"""The Episode: one token sequence with its mask, logprobs and versions, the chat, the limits."""

from __future__ import annotations

import pytest

from parity.core.types import Completion, TurnTiming
from parity.envs.episode import Episode, EpisodeLimits
from parity.envs.render import Renderer

PROMPT = [{"role": "user", "content": "Q"}]


def _episode(project_tokenizer, **limits) -> Episode:
    return Episode({"question": "Q", "answer": "A"}, PROMPT, Renderer(project_tokenizer),
                   EpisodeLimits(**limits))


def test_a_turn_and_an_observation_make_one_sequence(project_tokenizer) -> None:
    tok = project_tokenizer
    ep = _episode(tok)
    prompt = tok.encode("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n")
    assert (ep.tokens, ep.loss_mask, ep.num_tokens) == (prompt, [0] * len(prompt), len(prompt))
    ids = [*tok.encode("hi"), tok.eos_token_id]
    assert ep.act({"token_ids": ids}) == "hi"
    answer = [{"role": "user", "content": "ok"}]
    delta = ep.observation_delta(answer)
    assert tok.decode(delta) == "\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n"
    ep.observe(answer, delta)
    ep.time_turn(ep.start, 0.25)
    ep.sampled(Completion(ids, [-0.5] * 3, [7] * 3, "stop"), 1.5)
    n = len(prompt)
    assert ep.tokens == prompt + ids + delta
    assert ep.loss_mask == [0] * n + [1, 1, 1] + [0] * len(delta)
    assert ep.logprobs == [0.0] * n + [-0.5] * 3 + [0.0] * len(delta)
    assert ep.versions == [-1] * n + [7] * 3 + [-1] * len(delta)
    assert ep.messages == [*PROMPT, {"role": "assistant", "content": "hi"}, *answer]
    assert (ep.turn_timings[0].model_s, ep.turn_timings[0].sandbox_s) == (1.5, 0.25)
    ep.end("answer")
    traj = ep.trajectory("g", 1.0)
    assert (traj.tokens.tolist(), traj.versions.tolist(), traj.messages) == (ep.tokens, ep.versions,
                                                                           ep.messages)
    assert (traj.num_turns, traj.finish_reason, traj.failure, traj.task) == (1, "answer", None, ep.task)
    assert traj.turn_timings == [TurnTiming(1.5, ep.turn_timings[0].env_s, 0.25)]


def test_what_wrappers_observed_replaces_the_envs_tokens(project_tokenizer) -> None:
    ep = _episode(project_tokenizer)
    prompt = list(ep.tokens)
    ep.observed([*prompt, 5])
    assert (ep.tokens, ep.loss_mask) == ([*prompt, 5], [0] * (len(prompt) + 1))
    ep.act({"token_ids": [9, 2]})
    ep.observe([], [4, 4])
    ep.observed([6])
    assert ep.tokens == [*prompt, 5, 9, 2, 6] and ep.loss_mask[-3:] == [1, 1, 0]


def test_a_turn_the_engine_did_not_sample_is_refused(project_tokenizer) -> None:
    ep = _episode(project_tokenizer)
    ep.act({"token_ids": [9, 2]})
    ep.time_turn(ep.start, 0.0)
    with pytest.raises(ValueError, match="a different model turn than the engine sampled"):
        ep.sampled(Completion([9, 3], [0.0, 0.0], [1, 1], "stop"), 0.1)


def test_limits(project_tokenizer) -> None:
    ep = _episode(project_tokenizer, max_turns=2, max_tokens=30)
    ep.act("x")
    assert ep.num_tokens == 20 + 2  # the prompt, "x" and the end-of-turn token
    assert (ep.limit_reached(7), ep.limit_reached(8)) == ("", "max_tokens")
    ep.act("y")
    assert ep.limit_reached(0) == "max_turns"
    assert ep.seconds_left(ep.start + 1.0) == 299.0
