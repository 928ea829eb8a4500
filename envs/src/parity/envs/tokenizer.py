"""Tokenizers and chat rendering: the project's own character-level tokenizer, or any local
Hugging Face tokenizer directory, behind one small class.

The project tokenizer has one token per byte (so every character of ASCII text is one token,
which lets a tiny model copy digits) plus a few special tokens, and a ChatML template:

    <|im_start|>user\\nQ: 5831*47=?<|im_end|>\\n<|im_start|>assistant\\n

It is saved in standard Hugging Face form (tokenizer.json, tokenizer_config.json with
`chat_template`, special_tokens_map.json), so `transformers.AutoTokenizer` and vLLM load it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PROJECT_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# ChatML. Every message is closed by <|im_end|> and a newline; the newline is a template
# token the model never emits (the env renderer accounts for it).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Tokens that end a turn in common chat templates; any of them present in a vocabulary is
# a stop token for generation.
_END_OF_TURN_TOKENS = (
    IM_END, ENDOFTEXT, "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", "<end_of_turn>", "</s>",
)

Message = Mapping[str, Any]


class TokenizerError(ValueError):
    """A tokenizer directory is missing a file or a chat template, or a template failed."""


class Tokenizer:
    """A `tokenizers.Tokenizer` plus its chat template and special tokens.

    `encode` never adds special tokens of its own (no BOS): what you pass is what you get,
    with special-token strings in the text mapped to their ids. `decode` keeps special tokens.
    """

    def __init__(
        self,
        backend: HFTokenizer,
        chat_template: str,
        *,
        eos_token: str,
        bos_token: str | None = None,
        pad_token: str | None = None,
        extra_stop_ids: Sequence[int] = (),
        source: str = "<memory>",
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.eos_token = eos_token
        self.bos_token = bos_token
        self.pad_token = pad_token
        self.source = source
        self.eos_token_id = self._required_id(eos_token, "eos_token")
        self.pad_token_id = self._required_id(pad_token, "pad_token") if pad_token else None
        stops = [self.eos_token_id]
        for tok in _END_OF_TURN_TOKENS:
            tid = backend.token_to_id(tok)
            if tid is not None and tid not in stops:
                stops.append(tid)
        stops += [i for i in extra_stop_ids if i not in stops]
        self._stop_token_ids = stops
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        try:
            self._template = env.from_string(chat_template)
        except jinja2.TemplateError as e:
            raise TokenizerError(f"{source}: chat template does not compile: {e}") from e

    def _required_id(self, token: str, what: str) -> int:
        tid = self.backend.token_to_id(token)
        if tid is None:
            raise TokenizerError(f"{self.source}: {what} {token!r} is not in the vocabulary")
        return tid

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included (ids are 0..vocab_size-1)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def stop_token_ids(self) -> list[int]:
        """Ids that end a model turn: the EOS id first, then end-of-turn tokens in the vocab."""
        return list(self._stop_token_ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; lone surrogates (from bad decoding) become "?"."""
        try:
            return self.backend.encode(text, add_special_tokens=False).ids
        except TypeError:  # the Rust side only takes valid Unicode
            clean = text.encode("utf-8", "replace").decode("utf-8")
            return self.backend.encode(clean, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens kept; ids outside the vocabulary are dropped."""
        n = self.vocab_size
        return self.backend.decode([int(i) for i in ids if 0 <= int(i) < n], skip_special_tokens=False)

    def render_text(self, messages: Sequence[Message], add_generation_prompt: bool = False,
                    tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The chat template applied to `messages` (dicts with at least role and content) and,
        when given, `tools` (OpenAI-style function definitions, for templates that show them)."""
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token,
                **({"tools": [dict(t) for t in tools]} if tools else {}),
            )
        except jinja2.TemplateError as e:
            raise TokenizerError(f"{self.source}: chat template failed: {e}") from e

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        return self.encode(self.render_text(messages, add_generation_prompt, tools))

    def save(self, directory: str | Path) -> Path:
        """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(out / "tokenizer.json"))
        special = {"eos_token": self.eos_token, "bos_token": self.bos_token, "pad_token": self.pad_token}
        special = {k: v for k, v in special.items() if v is not None}
        added = {
            str(i): {"content": t.content, "special": t.special, "lstrip": t.lstrip,
                     "rstrip": t.rstrip, "normalized": t.normalized, "single_word": t.single_word}
            for i, t in self.backend.get_added_tokens_decoder().items()
        }
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": 131072,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "added_tokens_decoder": added,
            "chat_template": self.chat_template,
            **special,
        }
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
        return out


def _raise_template_error(message: str) -> None:
    raise jinja2.TemplateError(message)


def build_project_tokenizer() -> Tokenizer:
    """The project tokenizer: ids 0..2 are <|endoftext|>, <|im_start|>, <|im_end|>; ids
    3..258 are the 256 bytes (byte-level, so any text round-trips), in byte order.

    Deterministic: the same ids on every machine and every call.
    """
    table = _bytes_to_unicode()
    vocab = {tok: i for i, tok in enumerate(PROJECT_SPECIAL_TOKENS)}
    for b in range(256):
        vocab[table[b]] = len(vocab)
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    # No regex split: one token per byte, whatever the text.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in PROJECT_SPECIAL_TOKENS])
    return Tokenizer(
        backend, CHATML_TEMPLATE, eos_token=IM_END, pad_token=ENDOFTEXT, source="project tokenizer"
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode table (the symbols ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Load a local Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json).

    The chat template comes from tokenizer_config.json (`chat_template`, a string or a list
    of named templates, "default" chosen), chat_template.jinja or chat_template.json.
    Extra stop ids come from generation_config.json's `eos_token_id` when present.
    """
    d = Path(directory)
    tok_file = d / "tokenizer.json"
    if not tok_file.is_file():
        raise TokenizerError(f"{d}: no tokenizer.json (only fast tokenizers are supported)")
    config = _read_json(d / "tokenizer_config.json")
    template = _find_chat_template(d, config)
    if not template:
        raise TokenizerError(f"{d}: tokenizer has no chat template (tokenizer_config.json "
                             "chat_template, chat_template.jinja or chat_template.json)")
    special_map = _read_json(d / "special_tokens_map.json")

    def token(name: str) -> str | None:
        v = config.get(name) or special_map.get(name)
        return v.get("content") if isinstance(v, dict) else v

    eos = token("eos_token")
    if eos is None:
        raise TokenizerError(f"{d}: tokenizer_config.json has no eos_token")
    gen = _read_json(d / "generation_config.json").get("eos_token_id", [])
    extra = [gen] if isinstance(gen, int) else list(gen or [])
    return Tokenizer(
        HFTokenizer.from_file(str(tok_file)), template, eos_token=eos, bos_token=token("bos_token"),
        pad_token=token("pad_token"), extra_stop_ids=extra, source=str(d),
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path}: invalid JSON: {e}") from e


def _find_chat_template(d: Path, config: dict[str, Any]) -> str | None:
    t = config.get("chat_template")
    if isinstance(t, list):  # [{"name": ..., "template": ...}, ...]
        named = {x.get("name"): x.get("template") for x in t if isinstance(x, dict)}
        t = named.get("default") or next(iter(named.values()), None)
    if t:
        return t
    if (d / "chat_template.jinja").is_file():
        return (d / "chat_template.jinja").read_text()
    return _read_json(d / "chat_template.json").get("chat_template")
