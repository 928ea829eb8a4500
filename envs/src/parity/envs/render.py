"""Token deltas for observations, computed against the tokenizer's chat template.

Model tokens are never re-tokenized. After a model turn, the env appends exactly the tokens
that make the whole sequence read as the template's rendering of the conversation:

    ... <|im_start|>assistant\\n{model tokens, ending in <|im_end|>}
        {delta: "\\n<|im_start|>tool\\n42\\n<|im_end|>\\n<|im_start|>assistant\\n"}

The delta starts with whatever the template writes after an assistant message that the
model did not emit itself (ChatML's newline after <|im_end|>; the whole "<|im_end|>\\n"
when the turn was cut by the token limit). It is computed by rendering the new messages
after a fixed base conversation and taking the text the template added, so the template
only has to be append-only after an assistant message, not everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from parity.envs.tokenizer import Tokenizer

_SENTINEL = "\x00parity-sentinel\x00"
_BASE = ({"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL})


class RenderError(ValueError):
    """The chat template cannot be rendered incrementally (it rewrites earlier turns)."""


class Renderer:
    """Prompt tokens and observation deltas for one tokenizer's chat template."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._base_text = tokenizer.render_text(list(_BASE))
        at = self._base_text.rfind(_SENTINEL)
        if at < 0:
            raise RenderError(f"{tokenizer.source}: the chat template drops assistant content")
        # What the template writes after an assistant message's content, e.g. "<|im_end|>\n".
        self.after_assistant = self._base_text[at + len(_SENTINEL):]

    def prompt(self, messages: Sequence[Mapping[str, Any]],
               tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Tokens of the first prompt, ending with the generation prompt for the model; with
        `tools` shown as the template shows them (observation deltas assume it does so
        before the first assistant turn, as Qwen's and Hermes' templates do)."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)

    def closing(self, model_token_ids: Sequence[int]) -> str:
        """Template text still missing after a model turn that ended with `model_token_ids`."""
        if model_token_ids:
            last = self.tokenizer.decode(model_token_ids[-1:])
            if int(model_token_ids[-1]) in self.tokenizer.stop_token_ids and last and (
                self.after_assistant.startswith(last)
            ):
                return self.after_assistant[len(last):]
        return self.after_assistant

    def observation_delta(
        self, messages: Sequence[Mapping[str, Any]], model_token_ids: Sequence[int]
    ) -> list[int]:
        """Tokens to append after the model turn `model_token_ids`: the rest of the template
        after the model's message, `messages`, and the generation prompt for the next turn."""
        full = self.tokenizer.render_text([*_BASE, *messages], add_generation_prompt=True)
        if not full.startswith(self._base_text):
            raise RenderError(
                f"{self.tokenizer.source}: the chat template rewrites earlier turns when "
                f"messages with roles {[m.get('role') for m in messages]} follow an assistant turn"
            )
        return self.tokenizer.encode(self.closing(model_token_ids) + full[len(self._base_text):])
