"""Prompt layout: the stable part must not change while the user types on one line."""

from transformers import AutoTokenizer

from dgemma_lsp.engine.api import InfillContext
from dgemma_lsp.engine.model.prompting import CURSOR_MARKER, PromptBuilder
from dgemma_lsp.engine.model.tiny_model import ensure_tiny_random_model


def builder(**extra_tokens) -> PromptBuilder:
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_random_model())
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


CHATML = (
    "{% for m in messages %}<|im_start|>{{ 'assistant' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_prompt_follows_whatever_chat_template_the_tokenizer_carries():
    # Not only the tiny (Gemma-shaped) one: a builder that wrote Gemma's markers itself fails here.
    prompts = builder(start="<|im_start|>", end="<|im_end|>")
    prompts = PromptBuilder(_with_template(prompts.tokenizer, CHATML))
    context = InfillContext(prefix="x = ", suffix="\ny = 2\n", language="python")
    text = prompts.tokenizer.decode(prompts.build(context).all)
    user_turn = text.removeprefix("<|im_start|>user\n").removesuffix("<|im_end|>\n<|im_start|>assistant\n")
    assert user_turn != text and "<|turn>" not in text
    assert text == prompts.tokenizer.apply_chat_template(
        [{"role": "user", "content": user_turn}], add_generation_prompt=True, tokenize=False
    )
    assert f"x = {CURSOR_MARKER}\ny = 2" in user_turn


def _with_template(tokenizer, template: str):
    tokenizer.chat_template = template
    return tokenizer


def test_fim_tokens_are_used_when_the_tokenizer_has_them():
    prompts = builder(p="<|fim_prefix|>", s="<|fim_suffix|>", m="<|fim_middle|>")
    ids = prompts.build(InfillContext(prefix="a\nb", suffix="c"))
    text = prompts.tokenizer.decode(ids.all)
    assert text == "<|fim_prefix|>a\nb<|fim_suffix|>c<|fim_middle|>"


def test_suffix_first_keeps_the_suffix_in_the_stable_part_while_typing():
    prompts = builder()
    suffix = " + 1\n    return y\n\nprint(f(2))\n"
    natural = [prompts.build(InfillContext(prefix=f"def f(x):\n    y = {typed}", suffix=suffix))
               for typed in ("x", "x *", "x * 2")]
    first = [prompts.build(InfillContext(prefix=f"def f(x):\n    y = {typed}", suffix=suffix), layout="suffix-first")
             for typed in ("x", "x *", "x * 2")]
    assert len({tuple(p.stable) for p in first}) == 1  # a keystroke on the line changes only the tail
    assert max(len(p.tail) for p in first) < min(len(p.tail) for p in natural)  # the suffix left the tail
    text = prompts.tokenizer.decode(first[-1].all)
    assert text.index("print(f(2))") < text.index("def f(x):") < text.index(f"y = x * 2{CURSOR_MARKER} + 1")
    assert text.endswith("<|turn>model\n")


def test_a_rewrite_is_laid_out_naturally_whatever_the_layout():
    prompts = builder()
    context = InfillContext(prefix="def f(x):\n    ", suffix="\n    return y\n")
    assert (prompts.build(context, rewrite=True, layout="suffix-first")
            == prompts.build(context, rewrite=True, layout="natural"))


def test_the_layout_setting_reaches_the_engine_and_bad_values_are_refused():
    from dgemma_lsp.server.settings import ServerSettings, decode_settings

    settings, problems = decode_settings({"promptLayout": "suffix-first"})
    assert not problems and settings.generation(1).prompt_layout == "suffix-first"
    settings, problems = decode_settings({"promptLayout": "backwards"})
    assert problems and settings.prompt_layout == ServerSettings().prompt_layout


def test_a_model_folder_may_name_the_layout_it_reads_best(tmp_path):
    """`dgemma_prompt_layout` in tokenizer_config.json is the layout of a request that names none, in the
    runtime's builder and in a remote engine's layout alike; a request's own layout still wins."""
    import json
    import shutil

    from dgemma_lsp.engine.remote.template import layout_from_folder

    context = InfillContext(prefix="def f(x):\n    y = ", suffix="\n    return y\n", language="python")
    folder = tmp_path / "model"
    shutil.copytree(ensure_tiny_random_model(), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    plain = PromptBuilder(AutoTokenizer.from_pretrained(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "dgemma_prompt_layout": "suffix-first"}))
    named = PromptBuilder(AutoTokenizer.from_pretrained(folder))
    assert named.layout.text(context) == plain.layout.text(context, layout="suffix-first") != plain.layout.text(context)
    assert named.layout.text(context, layout="natural") == plain.layout.text(context)
    assert layout_from_folder(folder).text(context) == named.layout.text(context)
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "dgemma_prompt_layout": "sideways"}))
    assert PromptBuilder(AutoTokenizer.from_pretrained(folder)).layout.text(context) == plain.layout.text(context)
