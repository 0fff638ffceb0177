"""Chat turns as tokens, one turn at a time: what follows the model's turn, never a re-rendering of what came before.

Re-rendering a whole conversation with its chat template after every turn does not give back the tokens the model
saw: a template may rewrite earlier turns (Qwen3's drops the reasoning of earlier assistant turns, and renders the
last assistant turn differently from the others), and decoding the model's tokens and encoding the text again may
split it differently. Either way the trainer would be given tokens the model never produced. Here the episode's
tokens only ever grow:

* the first prompt is rendered once (`prompt_ids`: generation prompt added, as the prompt data is);
* after a model turn, observation messages become the *continuation*: the template renders a fixed stand-in
  conversation (a user message, an assistant message holding a marker) followed by the messages, generation prompt
  added; what comes after the marker is the text the template puts between an assistant turn's content and the
  next assistant turn -- the turn's closing (`<|im_end|>\\n` in ChatML), the messages, the generation prompt. Its
  tokens are appended, less those the model already produced: when the model ended its turn with the closing's
  first tokens (its end-of-turn token), they are not repeated; when it stopped elsewhere (a stop string), the whole
  closing is appended, so the next turn starts as the template would have it.

Those continuation tokens are not the model's: loss mask 0.
"""

from __future__ import annotations

from typing import Any

MARKER = "\u2063slime-actors-turn\u2063"   # stands for the model's turn in the stand-in conversation
STAND_IN = [{"role": "user", "content": "-"}, {"role": "assistant", "content": MARKER}]
MAX_OVERLAP = 16  # tokens of the model's turn end compared with the continuation's start


class ChatTemplateError(ValueError):
    """The chat template cannot render what was asked (no template, a role it refuses, a marker it drops)."""


class ChatTurns:
    """Renders chat turns to tokens with `tokenizer`'s chat template (`template_kwargs`: --apply-chat-template-kwargs,
    e.g. {"enable_thinking": False})."""

    def __init__(self, tokenizer: Any, template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.kwargs = dict(template_kwargs or {})
        self._closing_text: str | None = None

    @property
    def available(self) -> bool:
        return getattr(self.tokenizer, "chat_template", None) is not None

    def _render(self, messages: list[dict], tools: list | None = None, generation_prompt: bool = True) -> str:
        if not self.available:
            raise ChatTemplateError("the tokenizer has no chat template: give text (not chat messages), or a model "
                                    "whose tokenizer has one")
        kw = dict(self.kwargs)
        if tools is not None:
            kw["tools"] = tools
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=generation_prompt, **kw)
        except Exception as exc:
            roles = [m.get("role") for m in messages]
            raise ChatTemplateError(f"the chat template cannot render messages with roles {roles}: "
                                    f"{type(exc).__name__}: {exc}") from None
        if isinstance(text, list) and len(text) == 1:
            text = text[0]
        if not isinstance(text, str):
            raise ChatTemplateError(f"the chat template returned {type(text).__name__}, expected text")
        return text

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def prompt_ids(self, messages: list[dict], tools: list | None = None) -> tuple[str, list[int]]:
        """The first prompt: its text and tokens (the template carries any BOS itself, as for the prompt data)."""
        text = self._render(messages, tools)
        return text, self.encode(text)

    def continuation(self, model_ids: list[int], messages: list[dict]) -> list[int]:
        """The tokens that follow a model turn ending in `model_ids`: the turn's closing (less what the model
        already produced), `messages`, and the generation prompt of the next assistant turn."""
        text = self._render(STAND_IN + list(messages))
        at = text.rfind(MARKER)
        if at < 0:
            raise ChatTemplateError("the chat template dropped an earlier assistant turn's content; its "
                                    "continuation cannot be told apart")
        after = text[at + len(MARKER):]
        ids = self.encode(after)
        # only the turn's closing may overlap the model's last tokens (its end-of-turn token): never the messages
        closing = self._closing()
        limit = len(self.encode(closing)) if closing and after.startswith(closing) else 0
        tail = list(model_ids[-MAX_OVERLAP:])
        for k in range(min(len(tail), len(ids), limit), 0, -1):
            if tail[-k:] == ids[:k]:
                return ids[k:]
        return ids

    def _closing(self) -> str:
        """What the template writes after an assistant turn's content when the conversation ends there."""
        if self._closing_text is None:
            text = self._render(STAND_IN, generation_prompt=False)
            at = text.rfind(MARKER)
            self._closing_text = text[at + len(MARKER):] if at >= 0 else ""
        return self._closing_text
