"""Shared fixtures: the project tokenizer and Qwen2-style / Llama-3-style tokenizers built here."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from parity.envs.tokenizer import Tokenizer, build_project_tokenizer, load_tokenizer

# No network for `datasets`, and a private cache so no state survives between runs.
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="parity-envs-hf-")

QWEN2_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CORPUS = [
    "Q: 5831*47=? The answer is 274057. print(sum([1, 2, 3]))\n",
    "<py>print(12345*678)</py> <ans>8369910</ans> error: no tool call found\n",
    "Compute 1/3 + 1/6. The answer is \\boxed{\\frac{1}{2}}. Solve for x: 3x + 5 = 20.\n",
] * 20


def _bpe_dir(tmp: Path, specials: list[str], template: str, config: dict) -> Tokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    tmp.mkdir(parents=True, exist_ok=True)
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, **config}))
    return load_tokenizer(tmp)


@pytest.fixture(scope="session")
def project_tokenizer() -> Tokenizer:
    return build_project_tokenizer()


@pytest.fixture(scope="session")
def qwen2_tokenizer(tmp_path_factory) -> Tokenizer:
    return _bpe_dir(
        tmp_path_factory.mktemp("qwen2"), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        QWEN2_TEMPLATE, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )


@pytest.fixture(scope="session")
def llama3_tokenizer(tmp_path_factory) -> Tokenizer:
    return _bpe_dir(
        tmp_path_factory.mktemp("llama3"),
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        LLAMA3_TEMPLATE, {"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"},
    )


@pytest.fixture(params=["project", "qwen2", "llama3"])
def any_tokenizer(request) -> Tokenizer:
    return request.getfixturevalue(f"{request.param}_tokenizer")
