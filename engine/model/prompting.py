"""Prompt token ids for an infill or a rewrite, split into a stable part and a tail.

The stable part (chat-template head, instruction, preamble, the prefix up to the
cursor's line) is what the prompt cache keeps encoded between keystrokes; the
tail (the cursor's line, the marker, the suffix, the template's end) is encoded
per request. Each part is tokenized on its own, so the split never depends on
how BPE merges across it.

Layouts, inside the model's own chat template as an instruction, because the Gemma
vocabulary has no FIM tokens:
- "natural": the file in order (prefix, marker, suffix). The suffix sits after the
  cursor's line, so it is in the tail: re-encoded on every keystroke.
- "suffix-first": the code after the cursor's line first, then the file up to the
  marker, then the rest of the cursor's line. Everything but the cursor's line is in
  the stable part, so a keystroke re-encodes a few tokens instead of the whole suffix.
When a tokenizer does have FIM tokens, the PSM form is used instead. The `promptLayout`
setting chooses; left unset, a model folder may name the layout it reads best
(`dgemma_prompt_layout` in its tokenizer_config.json: the shipped `tiny` says suffix-first),
else "natural".
Snippets from other files (`InfillContext.cross_file`) come first, each file's under its
path, right after the instruction: inside the stable part, so a keystroke keeps them cached
(with FIM tokens: as line comments before the code).
`PromptLayout` lays the text out and needs no tokenizer (a remote engine sends
that text as it is); `PromptBuilder` encodes it. Knows the tokenizer; knows
nothing of torch or LSP (importing this module loads neither).
"""

from __future__ import annotations

import msgspec

from ..api import CrossFileSnippet, InfillContext

CURSOR_MARKER = "<CURSOR>"

INFILL_INSTRUCTION = (
    "Fill in the missing code at {marker} in this {language} file. "
    "Reply with only the code that goes at {marker}: no explanation, no Markdown fences, "
    "and do not repeat the code before or after it."
)
NEXT_EDIT_INSTRUCTION = (
    "The user just made the edits shown below to this {language} file. Rewrite the code at {marker} "
    "with the change that follows from them (the same rename, the same new argument, the matching "
    "fix); where nothing follows, reproduce it unchanged. "
    "Reply with only the code for {marker}: no explanation, no Markdown fences."
)
RECENT_EDITS = "\n\nThe user's recent edits, oldest first:\n\n```diff\n{diffs}```"
"""A next edit's diffs, shown between the instruction and the file (engine/nextedit/edits.py)."""
REWRITE_INSTRUCTION = (
    "Rewrite the code that goes at {marker} in this {language} file, keeping its purpose. "
    "Reply with only the new code for {marker}: no explanation, no Markdown fences."
)

SUFFIX_FIRST_AFTER = "\n\nThe code after the line with {marker}:\n\n{fence}\n{after}\n```"
"""suffix-first: the suffix past the cursor's line, shown before the file (see PROMPT_LAYOUTS)."""
SUFFIX_FIRST_BEFORE = "\n\nThe file up to {marker} and the rest of its line:\n\n{fence}\n"

PROMPT_LAYOUTS = ("natural", "suffix-first")
DEFAULT_PROMPT_LAYOUT = "natural"
MODEL_LAYOUT_KEY = "dgemma_prompt_layout"
"""tokenizer_config.json's key for a model's own default layout (one of PROMPT_LAYOUTS)."""
MODEL_CONTEXT_KEY = "dgemma_context_tokens"
"""tokenizer_config.json's key for the most context a model reads well, in the context budget's tokens
(engine/syntax/context.py's estimate): the longest it was trained on. Absent: no limit."""


def model_context_tokens(tokenizer) -> int | None:
    """The model's own context limit (MODEL_CONTEXT_KEY), or None when it names none or names nonsense."""
    return context_tokens_value(getattr(tokenizer, "init_kwargs", {}).get(MODEL_CONTEXT_KEY))


def context_tokens_value(value) -> int | None:
    """MODEL_CONTEXT_KEY's value as a count of tokens, or None when it is none (absent, not a positive int)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

CROSS_FILE_HEAD = "\n\nCode from other files of the workspace, for reference:"
CROSS_FILE_BLOCK = "\n\nFrom {path}:\n\n{fence}\n{text}\n```"
"""One file's snippets (in the order given, joined by a blank line) under its path."""
_LINE_COMMENT = {"python": "#", "lua": "--", "plaintext": "#"}

REWRITE_ORIGINAL = "\n\nThe code at {marker} is now:\n\n{fence}\n{original}\n```"
"""A rewrite's selection as it is now, shown after the file: the model sees what it rewrites
(`rewrite_keep` prompt/both, and every rewrite on an engine that cannot start from a canvas)."""

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


class PromptText(msgspec.Struct, frozen=True):
    """The text of one prompt, split where PromptIds splits it."""

    stable: str
    tail: str

    @property
    def all(self) -> str:
        return self.stable + self.tail


class PromptLayout:
    """Lays an InfillContext out as prompt text, given the chat template's head and tail.

    Needs no tokenizer: a remote engine (engine/remote/) builds one from the served
    model's tokenizer files and sends the text; PromptBuilder builds one from a
    loaded tokenizer and encodes the text. Both therefore send the same prompt.
    """

    def __init__(self, template_head: str, template_tail: str, fim_tokens: tuple[str, str, str] | None = None,
                 default_layout: str | None = None, context_tokens: int | None = None):
        self.template_head = template_head
        self.template_tail = template_tail
        self.fim_tokens = fim_tokens
        self.default_layout = default_layout if default_layout in PROMPT_LAYOUTS else DEFAULT_PROMPT_LAYOUT
        """The layout of a request that names none: the model's own (MODEL_LAYOUT_KEY), else natural."""
        self.context_tokens = context_tokens_value(context_tokens)
        """The most context the model reads well (MODEL_CONTEXT_KEY); None: no limit. A remote engine,
        which loads no tokenizer, reports it from here (EngineStatus.context_tokens)."""

    @classmethod
    def from_tokenizer(cls, tokenizer) -> PromptLayout:
        # Render the chat template around a placeholder once, to learn its head and tail text.
        head, tail = split_rendered_template(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": TEMPLATE_PLACEHOLDER}], add_generation_prompt=True, tokenize=False
            )
        )
        return cls(head, tail, find_fim_tokens(tokenizer.get_vocab()),
                   getattr(tokenizer, "init_kwargs", {}).get(MODEL_LAYOUT_KEY), model_context_tokens(tokenizer))

    def text(
        self, context: InfillContext, *, rewrite: bool = False, original: str | None = None, layout: str | None = None,
        edits: str | None = None,
    ) -> PromptText:
        """The prompt text; `original` (a rewrite's selection as it is now) is shown after the file.

        `layout` is one of PROMPT_LAYOUTS (None: the model's default_layout); a rewrite is always natural.
        `edits` (a rewrite only: the recent edits as diffs) makes it a next edit: the instruction asks
        for the change that follows them, and they are shown before the file.
        """
        # The cursor's own line goes in the tail: it changes with every keystroke.
        line_start = context.prefix.rfind("\n") + 1
        stable_code = context.preamble + context.prefix[:line_start]
        line_before_cursor = context.prefix[line_start:]
        if self.fim_tokens and not rewrite:
            prefix_token, suffix_token, middle_token = self.fim_tokens
            return PromptText(
                stable=prefix_token + cross_file_comments(context.cross_file, context.language) + stable_code,
                tail=line_before_cursor + suffix_token + context.suffix + middle_token,
            )
        fence = "```" + ("" if context.language == "plaintext" else context.language)
        next_edit = rewrite and edits is not None
        template = NEXT_EDIT_INSTRUCTION if next_edit else REWRITE_INSTRUCTION if rewrite else INFILL_INSTRUCTION
        instruction = template.format(marker=CURSOR_MARKER, language=context.language)
        instruction += cross_file_text(context.cross_file, fence)
        if next_edit:
            instruction += RECENT_EDITS.format(diffs=edits or "(none)\n")
        if (layout or self.default_layout) == "suffix-first" and not rewrite:
            # The cursor's line stays whole in the tail; what is after it leads the stable part.
            rest_of_line, newline, after = context.suffix.partition("\n")
            shown_after = SUFFIX_FIRST_AFTER.format(marker=CURSOR_MARKER, fence=fence, after=after) if newline else ""
            before = SUFFIX_FIRST_BEFORE.format(marker=CURSOR_MARKER, fence=fence)
            return PromptText(
                stable=f"{self.template_head}{instruction}{shown_after}{before}{stable_code}",
                tail=f"{line_before_cursor}{CURSOR_MARKER}{rest_of_line}\n```{self.template_tail}",
            )
        shown = "" if original is None else REWRITE_ORIGINAL.format(marker=CURSOR_MARKER, fence=fence, original=original)
        return PromptText(
            stable=f"{self.template_head}{instruction}\n\n{fence}\n{stable_code}",
            tail=f"{line_before_cursor}{CURSOR_MARKER}{context.suffix}\n```{shown}{self.template_tail}",
        )


def cross_file_text(snippets: tuple[CrossFileSnippet, ...], fence: str) -> str:
    """The snippets as fenced blocks, one per file under its path ("" when there are none)."""
    if not snippets:
        return ""
    parts = [CROSS_FILE_HEAD]
    for path, texts in _by_path(snippets):
        parts.append(CROSS_FILE_BLOCK.format(path=path, fence=fence, text="\n\n".join(texts)))
    return "".join(parts)


def cross_file_comments(snippets: tuple[CrossFileSnippet, ...], language: str) -> str:
    """The snippets as line comments, each file under its path (a FIM prompt has no room for prose)."""
    mark = _LINE_COMMENT.get(language, "//")
    lines: list[str] = []
    for path, texts in _by_path(snippets):
        lines.append(f"{mark} From {path}:")
        lines.extend(f"{mark} {line}".rstrip() for text in texts for line in text.split("\n"))
    return "".join(line + "\n" for line in lines)


def _by_path(snippets: tuple[CrossFileSnippet, ...]) -> list[tuple[str, list[str]]]:
    """Snippets grouped by file, files in order of their first snippet."""
    groups: dict[str, list[str]] = {}
    for snippet in snippets:
        groups.setdefault(snippet.heading, []).append(snippet.text)
    return list(groups.items())


class PromptBuilder:
    """Turns an InfillContext into PromptIds for one tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.layout = PromptLayout.from_tokenizer(tokenizer)
        self.fim_tokens = self.layout.fim_tokens

    def build(
        self, context: InfillContext, *, rewrite: bool = False, original: str | None = None, layout: str | None = None,
        edits: str | None = None,
    ) -> PromptIds:
        text = self.layout.text(context, rewrite=rewrite, original=original, layout=layout, edits=edits)
        return PromptIds(stable=self._encode(text.stable), tail=self._encode(text.tail))

    def _encode(self, text: str) -> list[int]:
        # The template already carries <bos>: never let the tokenizer add another.
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


TEMPLATE_PLACEHOLDER = "\x00CONTENT\x00"
"""The user message the chat template is rendered around; split on it to get head and tail."""


def split_rendered_template(rendered: str) -> tuple[str, str]:
    """(head, tail) of a chat template rendered around TEMPLATE_PLACEHOLDER."""
    head, found, tail = rendered.partition(TEMPLATE_PLACEHOLDER)
    assert found, "the chat template dropped the user message"
    return head, tail


def find_fim_tokens(vocab) -> tuple[str, str, str] | None:
    """The first FIM token set whose three tokens are all in `vocab` (a container of token strings)."""
    for names in FIM_TOKEN_SETS:
        if all(name in vocab for name in names):
            return names
    return None
