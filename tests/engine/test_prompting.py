"""Prompt layout: the stable part must not change while the user types on one line."""

from transformers import AutoTokenizer

from dgemma_lsp.engine.api import InfillContext
from dgemma_lsp.engine.runtime.prompting import CURSOR_MARKER, PromptBuilder
from dgemma_lsp.engine.runtime.tiny_model import ensure_tiny_model


def builder(**extra_tokens) -> PromptBuilder:
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model())
    if extra_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(extra_tokens.values())})
    return PromptBuilder(tokenizer)


def test_typing_on_the_cursor_line_keeps_the_stable_part():
    prompts = builder()
    before = prompts.build(InfillContext(prefix="import os\n\ndef f():\n    ret", suffix="\n"))
    after = prompts.build(InfillContext(prefix="import os\n\ndef f():\n    return os.", suffix="\n"))
    assert before.stable == after.stable
    assert before.tail != after.tail


def test_instruction_prompt_uses_the_chat_template_and_marks_the_cursor():
    prompts = builder()
    ids = prompts.build(InfillContext(prefix="x = ", suffix="\ny = 2\n", language="python"))
    text = prompts.tokenizer.decode(ids.all)
    assert text.startswith("<bos><|turn>user\n")
    assert text.endswith("<|turn>model\n")
    assert f"x = {CURSOR_MARKER}\ny = 2" in text


def test_fim_tokens_are_used_when_the_tokenizer_has_them():
    prompts = builder(p="<|fim_prefix|>", s="<|fim_suffix|>", m="<|fim_middle|>")
    ids = prompts.build(InfillContext(prefix="a\nb", suffix="c"))
    text = prompts.tokenizer.decode(ids.all)
    assert text == "<|fim_prefix|>a\nb<|fim_suffix|>c<|fim_middle|>"
