"""The project tokenizer, HF directory loading, and transformers compatibility."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.envs.tokenizer import (
    TokenizerError,
    build_project_tokenizer,
    load_tokenizer,
)

TOK = build_project_tokenizer()
CHAT = [
    {"role": "system", "content": "Use the tool."},
    {"role": "user", "content": "Q: 5831*47=?"},
    {"role": "assistant", "content": "<py>print(5831*47)</py>"},
    {"role": "tool", "content": "274057\n"},
    {"role": "assistant", "content": "<ans>274057</ans>"},
]


def test_ids_are_fixed_and_one_per_byte() -> None:
    assert TOK.vocab_size == 259
    assert TOK.encode("<|endoftext|><|im_start|><|im_end|>") == [0, 1, 2]
    assert TOK.eos_token_id == 2
    assert TOK.stop_token_ids == [2, 0]
    # byte b has id b + 3: digits copy one token per character
    assert TOK.encode("0129") == [48 + 3, 49 + 3, 50 + 3, 57 + 3]
    assert TOK.encode("é") == [0xC3 + 3, 0xA9 + 3]
    assert build_project_tokenizer().encode("Q: 5831*47=?") == TOK.encode("Q: 5831*47=?")


SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@settings(max_examples=200, deadline=None)
@given(st.text() | st.lists(st.sampled_from(["a", "<|", "|>", *SPECIALS])).map("".join))
def test_any_text_round_trips_and_concatenates(text: str) -> None:
    ids = TOK.encode(text)
    assert TOK.decode(ids) == text
    # char-level: encoding is a homomorphism over concatenation, except that a cut inside a
    # special token's text leaves its two halves as plain bytes
    half = len(text) // 2
    if not _cuts_a_special(text, half):
        assert TOK.encode(text[:half]) + TOK.encode(text[half:]) == ids


def _cuts_a_special(text: str, cut: int) -> bool:
    for s in SPECIALS:
        i = text.find(s)
        while i >= 0:
            if i < cut < i + len(s):
                return True
            i = text.find(s, i + len(s))
    return False


def test_chatml_render() -> None:
    text = TOK.render_text(CHAT[:2], add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nUse the tool.<|im_end|>\n"
        "<|im_start|>user\nQ: 5831*47=?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert TOK.apply_chat_template(CHAT[:2], add_generation_prompt=True) == TOK.encode(text)
    assert TOK.render_text(CHAT[:2]).endswith("<|im_end|>\n")


def test_lone_surrogates_encode_as_question_marks() -> None:
    assert TOK.encode("a\udcffb") == TOK.encode("a?b")


def test_decode_drops_out_of_range_ids() -> None:
    assert TOK.decode([3 + 65, 10**9, -1, 3 + 66]) == "AB"


def test_save_load_round_trip_and_transformers(tmp_path) -> None:
    TOK.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
    ]
    loaded = load_tokenizer(tmp_path)
    assert loaded.apply_chat_template(CHAT) == TOK.apply_chat_template(CHAT)
    assert loaded.stop_token_ids == TOK.stop_token_ids
    assert loaded.vocab_size == 259

    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.eos_token_id == 2 and hf.pad_token_id == 0
    assert hf.encode("Q: 12*3=?", add_special_tokens=False) == TOK.encode("Q: 12*3=?")
    hf_ids = hf.apply_chat_template(CHAT[:2], add_generation_prompt=True, tokenize=True)
    if isinstance(hf_ids, dict) or hasattr(hf_ids, "keys"):
        hf_ids = hf_ids["input_ids"]
    assert list(hf_ids) == TOK.apply_chat_template(CHAT[:2], add_generation_prompt=True)
    assert hf.decode(TOK.encode("x<|im_end|>")) == "x<|im_end|>"


def test_missing_chat_template_names_directory(tmp_path) -> None:
    TOK.save(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TokenizerError, match=f"{tmp_path}: tokenizer has no chat template"):
        load_tokenizer(tmp_path)
    # a chat_template.jinja file next to it is found
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert load_tokenizer(tmp_path).render_text([{"role": "user", "content": "hi"}]) == "[hi]"


def test_missing_tokenizer_json_and_bad_template(tmp_path) -> None:
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path)
    TOK.save(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="chat template failed: first must be user"):
        tok.render_text([{"role": "system", "content": "x"}])


def test_generation_config_adds_stop_ids(tmp_path) -> None:
    TOK.save(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert load_tokenizer(tmp_path).stop_token_ids == [2, 0, 7]
