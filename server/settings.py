"""The server's user settings: one frozen msgspec Struct, camelCase on the wire.

Read from `initializationOptions` at initialize and from
`workspace/didChangeConfiguration` afterwards, either flat or under a "dgemma"
section. Decoding is forgiving by key: an invalid value falls back to its
default and is named in the returned problem list (the server shows it once
with `window/showMessage`); unknown keys are ignored (editors send their own).
Knows msgspec and the engine's GenerationSettings; knows nothing of pygls.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from dgemma_lsp.engine.api import GenerationSettings
from dgemma_lsp.engine.syntax.infill import context_budget

SECTION = "dgemma"
"""Configuration section name in editors (`dgemma.steps`, ...)."""


class ServerSettings(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=False):
    """Everything a user can tune. Documented key by key in docs/configuration.md."""

    enable: bool = True
    """Answer inline completion requests at all (code actions keep working)."""
    drafts: bool = False
    """Send `dgemma/draft` notifications while denoising (opt-in)."""
    status: bool | None = None
    """Send `dgemma/status` notifications (opt-in); null follows `drafts`."""
    max_candidates: Annotated[int, msgspec.Meta(ge=1, le=8)] = 3
    """Candidates for an Invoked request (Automatic requests always get 1)."""
    steps: Annotated[int, msgspec.Meta(ge=1, le=256)] | None = None
    """Maximum denoising steps per canvas; null = the model's default."""
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=4096)] | None = None
    """Upper bound on one answer's length in tokens, rounded up to whole canvases; null: one canvas."""
    seed: int | None = None
    """Fix the noise for reproducible answers; null draws fresh noise each time."""
    debounce_ms: Annotated[int, msgspec.Meta(ge=0, le=2000)] = 25
    """Coalescing window: a cache miss waits this long for a newer keystroke before denoising."""
    context_tokens: Annotated[int, msgspec.Meta(ge=64, le=131072)] = 2048
    """Token budget of the code around the cursor that goes into the prompt."""
    cross_file: bool = True
    """Show the model snippets from other workspace files (docs/context.md); false sends the current file alone."""
    cross_file_tokens: Annotated[int, msgspec.Meta(ge=0, le=65536)] | None = None
    """Token budget of those snippets, apart from `contextTokens`; null: a quarter of `contextTokens`."""
    rewrite_strength: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.6
    """How much of the selection "Rewrite selection" renoises: 1 writes it afresh."""
    early_stop: bool = True
    """Stop a canvas once it is stable and confident; false always runs `steps`."""
    prompt_layout: Literal["natural", "suffix-first"] | None = None
    """How the prompt lays the file out: "suffix-first" keeps all but the cursor's line in the
    engine's prompt cache; null: the default ("natural", see bench/RESULTS.md, "Editor latency": prompt
    layouts, for why)."""
    cache_size: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 128
    """Finished completions kept for repeated and typed-ahead requests (0 disables the cache)."""
    prompt_cache_mb: Annotated[int, msgspec.Meta(ge=0, le=1048576)] | None = msgspec.field(
        default=None, name="promptCacheMB"
    )
    """MiB of encoder-cache snapshots the engine keeps on the GPU (0 keeps none); null: a quarter of
    the memory free after loading. A daemon shared by several editors takes the last one sent."""

    next_edit: bool = True
    """Answer `textDocument/copilotInlineEdit` (next-edit suggestions, docs/next-edit.md)."""
    next_edit_strength: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.4
    """How much of the edit window a next edit renoises: 1 writes it afresh."""
    next_edit_lines: Annotated[int, msgspec.Meta(ge=1, le=200)] = 30
    """Longest edit window, in lines (the syntax node around the cursor and the last edit)."""
    next_edit_debounce_ms: Annotated[int, msgspec.Meta(ge=0, le=3000)] = 300
    """Coalescing window of a next edit before rejections (x1.5 each) and acceptances (x0.8) adapt it."""

    @property
    def prompt_cache_bytes(self) -> int | None:
        return None if self.prompt_cache_mb is None else self.prompt_cache_mb * 1024 * 1024

    @property
    def cross_file_budget(self) -> int:
        """Tokens the cross-file snippets may take (0 when switched off)."""
        if not self.cross_file:
            return 0
        return self.context_tokens // 4 if self.cross_file_tokens is None else self.cross_file_tokens

    def within_model_context(self, model_tokens: int | None) -> ServerSettings:
        """These settings with the context budgets cut to what the model reads well (EngineStatus.context_tokens).

        A model trained on short contexts (the built-in tiny one: 160 tokens) writes noise past them; the
        cross-file snippets share the model's window, so they get at most a quarter of it."""
        budget = context_budget(model_tokens, self.context_tokens)
        if budget == self.context_tokens:
            return self
        return msgspec.structs.replace(self, context_tokens=budget,
                                       cross_file_tokens=min(self.cross_file_budget, model_tokens // 4))

    @property
    def wants_status(self) -> bool:
        """Whether the client opted into `dgemma/status` (explicitly, or by opting into drafts)."""
        return self.drafts if self.status is None else self.status

    def generation(self, candidates: int) -> GenerationSettings:
        """The engine's knobs for a request asking for `candidates` candidates."""
        return GenerationSettings(
            steps=self.steps,
            max_tokens=self.max_tokens,
            candidates=candidates,
            seed=self.seed,
            early_stop=self.early_stop,
            prompt_layout=self.prompt_layout,
        )


def decode_settings(
    raw: Any, base: ServerSettings | None = None
) -> tuple[ServerSettings, list[str]]:
    """Settings from a JSON-like payload layered over `base`; returns them and the bad keys.

    A payload that is not an object is itself a problem ("<settings>"). Keys
    absent from the payload keep their value from `base` (defaults if None).
    """
    base = base or ServerSettings()
    if raw is None:
        return base, []
    if isinstance(raw, dict) and isinstance(raw.get(SECTION), dict):
        raw = raw[SECTION]
    if not isinstance(raw, dict):
        return base, ["<settings>"]
    known = set(ServerSettings.__struct_encode_fields__)
    merged = {k: v for k, v in msgspec.to_builtins(base).items()}
    merged.update({k: v for k, v in raw.items() if k in known})
    bad: list[str] = []
    # Drop one offending key per round: msgspec names the first invalid path.
    for _ in range(len(known) + 1):
        try:
            return msgspec.convert(merged, ServerSettings), bad
        except msgspec.ValidationError as error:
            key = _offending_key(str(error), merged)
            if key is None:
                return base, ["<settings>"]
            bad.append(key)
            default = getattr(ServerSettings(), _attr_name(key))
            merged[key] = msgspec.to_builtins(default)
    return base, bad


def _offending_key(message: str, merged: dict[str, Any]) -> str | None:
    # msgspec errors end with "- at `$.keyName`" (or `$.keyName[0]`).
    marker = "at `$."
    at = message.rfind(marker)
    if at < 0:
        return None
    path = message[at + len(marker):].rstrip("`")
    key = path.split("[", 1)[0].split(".", 1)[0]
    return key if key in merged else None


def _attr_name(camel: str) -> str:
    for attr, encoded in zip(ServerSettings.__struct_fields__, ServerSettings.__struct_encode_fields__, strict=True):
        if encoded == camel:
            return attr
    raise KeyError(camel)
