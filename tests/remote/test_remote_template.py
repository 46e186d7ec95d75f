"""The remote engine's prompt layout, read from tokenizer files, equals the one transformers renders.

The remote client renders the chat template with jinja2 itself (no transformers
in a light language server); these tests hold it to transformers' own
`apply_chat_template` on the tiny tokenizer and on a Gemma-3-style template
(system prefix, role checks with `raise_exception`, `trim`, loop controls).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from dgemma_lsp.engine.api import InfillContext
from dgemma_lsp.engine.errors import ModelNotFoundError
from dgemma_lsp.engine.model.prompting import PromptLayout
from dgemma_lsp.engine.model.tiny_model import ensure_tiny_random_model
from dgemma_lsp.engine.remote.template import layout_from_folder, load_layout

GEMMA3_STYLE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- if loop.last %}{% break %}{% endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
CONTEXT = InfillContext(prefix="def f(x):\n    return ", suffix="\n", language="python")


def saved_tokenizer(folder, template: str | None = None, fim: bool = False):
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_random_model())
    if template is not None:
        tokenizer.chat_template = template
    if fim:
        tokenizer.add_special_tokens(
            {"additional_special_tokens": ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]}
        )
    tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("template", [None, GEMMA3_STYLE], ids=["tiny", "gemma3-style"])
def test_the_layout_from_files_is_the_layout_transformers_renders(tmp_path, template):
    tokenizer = saved_tokenizer(tmp_path, template)
    ours, theirs = layout_from_folder(tmp_path), PromptLayout.from_tokenizer(tokenizer)
    assert (ours.template_head, ours.template_tail, ours.fim_tokens) == (
        theirs.template_head, theirs.template_tail, theirs.fim_tokens)
    assert ours.text(CONTEXT) == theirs.text(CONTEXT)
    assert ours.text(CONTEXT, rewrite=True) == theirs.text(CONTEXT, rewrite=True)


def test_fim_tokens_in_the_files_are_found(tmp_path):
    tokenizer = saved_tokenizer(tmp_path, fim=True)
    assert layout_from_folder(tmp_path).fim_tokens == PromptLayout.from_tokenizer(tokenizer).fim_tokens is not None


def test_a_model_without_files_or_a_known_template_is_a_clear_error():
    with pytest.raises(ModelNotFoundError):
        load_layout("nobody-at-all/no-such-model")


def test_the_random_models_layout_is_never_built_in_a_language_servers_process(tmp_path):
    """Not built yet: no tokenizer files (a one-line error later), and no torch imported to build them."""
    code = ("import sys; from dgemma_lsp.engine.remote.template import find_tokenizer_folder; "
            "print(find_tokenizer_folder('tiny-random'), find_tokenizer_folder('tiny') is not None, "
            "sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "DGEMMA_LSP_CACHE": str(tmp_path)})
    assert done.stdout.split() == ["None", "True", "[]"]
    assert not any(tmp_path.iterdir())
