"""Prompt token ids for an infill or a rewrite, split into a stable part and a tail.

The stable part (chat-template head, instruction, preamble, the prefix up to the
cursor's line) is what the prompt cache keeps encoded between keystrokes; the
tail (the cursor's line, the marker, the suffix, the template's end) is encoded
per request. Each part is tokenized on its own, so the split never depends on
how BPE merges across it.

Layout: the natural one (prefix, marker, suffix) inside the model's own chat
template as an instruction, because the Gemma vocabulary has no FIM tokens.
When a tokenizer does have FIM tokens, the PSM form is used instead. Knows the
tokenizer; knows nothing of torch or LSP.
"""

from __future__ import annotations

import msgspec

from ..api import InfillContext

CURSOR_MARKER = "<CURSOR>"

INFILL_INSTRUCTION = (
    "Fill in the missing code at {marker} in this {language} file. "
    "Reply with only the code that goes at {marker}: no explanation, no Markdown fences, "
    "and do not repeat the code before or after it."
)
REWRITE_INSTRUCTION = (
    "Rewrite the code that goes at {marker} in this {language} file, keeping its purpose. "
    "Reply with only the new code for {marker}: no explanation, no Markdown fences."
)

REWRITE_ORIGINAL = "\n\nThe code at {marker} is now:\n\n{fence}\n{original}\n```"

FIM_TOKEN_SETS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
)


class PromptIds(msgspec.Struct, frozen=True):
    """Token ids of one prompt: encode `stable` once per document, `tail` per request."""

    stable: list[int]
    tail: list[int]

    @property
    def all(self) -> list[int]:
        return self.stable + self.tail


class PromptBuilder:
    """Turns an InfillContext into PromptIds for one tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.fim_tokens = _find_fim_tokens(tokenizer)
        # Render the chat template around a placeholder once, to learn its head and tail text.
        placeholder = "\x00CONTENT\x00"
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": placeholder}], add_generation_prompt=True, tokenize=False
        )
        self.template_head, self.template_tail = rendered.split(placeholder)

    def build(self, context: InfillContext, *, rewrite: bool = False, original: str | None = None) -> PromptIds:
        """`original`: a rewrite's selection as it is now, shown to the model after the file."""
        # The cursor's own line goes in the tail: it changes with every keystroke.
        line_start = context.prefix.rfind("\n") + 1
        stable_code = context.preamble + context.prefix[:line_start]
        line_before_cursor = context.prefix[line_start:]
        if self.fim_tokens and not rewrite:
            prefix_token, suffix_token, middle_token = self.fim_tokens
            stable_text = prefix_token + stable_code
            tail_text = line_before_cursor + suffix_token + context.suffix + middle_token
        else:
            instruction = (REWRITE_INSTRUCTION if rewrite else INFILL_INSTRUCTION).format(
                marker=CURSOR_MARKER, language=context.language
            )
            fence = "```" + ("" if context.language == "plaintext" else context.language)
            stable_text = f"{self.template_head}{instruction}\n\n{fence}\n{stable_code}"
            shown = "" if original is None else REWRITE_ORIGINAL.format(
                marker=CURSOR_MARKER, fence=fence, original=original
            )
            tail_text = f"{line_before_cursor}{CURSOR_MARKER}{context.suffix}\n```{shown}{self.template_tail}"
        return PromptIds(stable=self._encode(stable_text), tail=self._encode(tail_text))

    def _encode(self, text: str) -> list[int]:
        # The template already carries <bos>: never let the tokenizer add another.
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def _find_fim_tokens(tokenizer) -> tuple[str, str, str] | None:
    vocab = tokenizer.get_vocab()
    for names in FIM_TOKEN_SETS:
        if all(name in vocab for name in names):
            return names
    return None
