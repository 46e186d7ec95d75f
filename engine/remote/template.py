"""The served model's prompt layout, read from its tokenizer files without loading a model.

A remote engine must send the same prompt text the in-process engine encodes
(`PromptLayout`, engine/model/prompting.py), chat template included. The
template lives in the model's tokenizer files (`chat_template.jinja`, or
`chat_template` in `tokenizer_config.json`), found the way the runtime finds a
model: `tiny`, a local folder, or a Hugging Face id in the local HF cache (only
those small files are needed, never the weights). It is rendered with jinja2
in a sandbox configured as transformers configures it (trim_blocks,
lstrip_blocks, loopcontrols, `raise_exception`, `strftime_now`, a non-escaping
`tojson`, the special tokens as variables) — transformers itself is not
imported, since it drags torch in on first use of most of its API.

When no tokenizer files are at hand for the default checkpoint, its known
template (`<bos><|turn>user\\n…<turn|>\\n<|turn>model\\n`, REFERENCE.md) is used
and the source says so; for any other model that is an error saying what to
fetch. Knows files, JSON and jinja2; knows nothing of HTTP, torch or LSP.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path

from ..errors import ModelNotFoundError
from ..model.folders import DEFAULT_MODEL_ID
from ..model.prompting import (
    FIM_TOKEN_SETS,
    MODEL_CONTEXT_KEY,
    MODEL_LAYOUT_KEY,
    TEMPLATE_PLACEHOLDER,
    PromptLayout,
    find_fim_tokens,
    split_rendered_template,
)

log = logging.getLogger(__name__)

TOKENIZER_FILES = ["tokenizer_config.json", "chat_template.jinja", "chat_template.json", "tokenizer.json"]
"""What the layout needs from a model folder (a few MB; never the weights)."""

KNOWN_LAYOUTS = {DEFAULT_MODEL_ID: PromptLayout("<bos><|turn>user\n", "<turn|>\n<|turn>model\n")}
"""Checkpoints whose chat template is known here, for machines that hold none of their files."""

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def load_layout(model: str) -> tuple[PromptLayout, str]:
    """The prompt layout of `model` and where it came from (a folder, or "built-in").

    Raises ModelNotFoundError when no tokenizer files are found and the model's
    template is not known here.
    """
    folder = find_tokenizer_folder(model)
    if folder is not None:
        return layout_from_folder(folder), str(folder)
    if model in KNOWN_LAYOUTS:
        log.info("no tokenizer files for %s here: using its built-in chat template", model)
        return KNOWN_LAYOUTS[model], "built-in"
    raise ModelNotFoundError(
        f"no tokenizer files for '{model}' on this machine: pass --model with a local folder holding "
        f"{', '.join(TOKENIZER_FILES[:2])}, or download only those "
        f"(`hf download {model} {' '.join(TOKENIZER_FILES)}`)"
    )


def find_tokenizer_folder(model: str) -> Path | None:
    """A local folder with `model`'s tokenizer files, or None."""
    from ..model.tiny_model import BUILTIN_MODELS, builtin_model_folder

    if model in BUILTIN_MODELS:
        folder = builtin_model_folder(model, build=False)  # never torch in a language server's process
        return folder if (folder / "tokenizer_config.json").is_file() else None
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if model.count("/") != 1 or model.startswith((".", "/", "~")):
        return None
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(model, local_files_only=True, allow_patterns=TOKENIZER_FILES))
    except Exception as error:  # noqa: BLE001 - not cached / invalid id: both mean "no files here"
        log.debug("no cached tokenizer files for %s: %s", model, error)
        return None
    return folder if (folder / "tokenizer_config.json").is_file() else None


def layout_from_folder(folder: Path) -> PromptLayout:
    """Render the folder's chat template around the placeholder, as PromptLayout.from_tokenizer does."""
    config = _read_json(folder / "tokenizer_config.json")
    template = _chat_template(folder, config)
    variables = {key: _token_text(config.get(key)) for key in SPECIAL_TOKEN_KEYS if config.get(key) is not None}
    rendered = render_chat_template(
        template,
        messages=[{"role": "user", "content": TEMPLATE_PLACEHOLDER}],
        add_generation_prompt=True,
        **variables,
    )
    head, tail = split_rendered_template(rendered)
    return PromptLayout(head, tail, find_fim_tokens(_token_names(folder, config)), config.get(MODEL_LAYOUT_KEY),
                        config.get(MODEL_CONTEXT_KEY))


def render_chat_template(template: str, **variables) -> str:
    """Render a chat template the way transformers' apply_chat_template(tokenize=False) does."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers overrides jinja's tojson, which would HTML-escape the text
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return environment.from_string(template).render(**variables)


def _chat_template(folder: Path, config: dict) -> str:
    if (folder / "chat_template.jinja").is_file():  # transformers >= 4.50 saves it apart
        return (folder / "chat_template.jinja").read_text("utf-8")
    template = config.get("chat_template")
    if template is None and (folder / "chat_template.json").is_file():
        template = _read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one is apply_chat_template's
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str):
        raise ModelNotFoundError(f"the tokenizer files in '{folder}' hold no chat template")
    return template


def _token_names(folder: Path, config: dict) -> set[str]:
    """Every token string the vocabulary knows that could be a FIM token (added tokens and, cheaply, the vocab)."""
    names = {_token_text(t) for t in (config.get("added_tokens_decoder") or {}).values()}
    names |= {_token_text(t) for t in config.get("additional_special_tokens") or []}
    wanted = {name for names_set in FIM_TOKEN_SETS for name in names_set}
    tokenizer_file = folder / "tokenizer.json"
    if tokenizer_file.is_file():
        tokenizer = _read_json(tokenizer_file)
        names |= {t.get("content") for t in tokenizer.get("added_tokens") or []}
        vocab = (tokenizer.get("model") or {}).get("vocab") or {}
        if isinstance(vocab, dict):
            names |= wanted & vocab.keys()
    return {name for name in names if isinstance(name, str)}


def _token_text(token) -> str | None:
    """A special token as tokenizer_config.json stores it: a string, or {"content": ...}."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as error:
        raise ModelNotFoundError(f"unreadable tokenizer file '{path}': {error}") from None
    if not isinstance(data, dict):
        raise ModelNotFoundError(f"tokenizer file '{path}' is not a JSON object")
    return data
