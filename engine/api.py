"""Public types of the engine: what crosses its boundary.

Small frozen msgspec Structs, one docstring per field. The server, the CLI and
the resident-engine daemon speak only these; the same Structs are the daemon's
wire format (msgpack). Offsets are Python str indices into the document text;
the server converts LSP positions to and from them. Knows no torch, no LSP.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class GenerationSettings(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Denoising knobs. None means the model's own generation_config default."""

    steps: int | None = None
    """Maximum denoising steps per canvas (the checkpoint's default is 48)."""
    entropy_bound: float | None = None
    """Entropy-bound sampler budget: higher accepts more tokens per step."""
    t_max: float | None = None
    """Temperature at the first step (linear schedule down to t_min)."""
    t_min: float | None = None
    """Temperature at the last step."""
    max_tokens: int | None = None
    """Upper bound on the answer length in tokens, rounded up to whole canvases; None is one canvas."""
    candidates: int = 1
    """How many canvases to denoise in one batch (B candidates)."""
    seed: int | None = None
    """Seed for the canvas noise and the sampler; None draws a fresh one."""
    early_stop: bool = True
    """Stop a canvas once it is stable and confident (the checkpoint's rule)."""
    prompt_layout: Literal["natural", "suffix-first"] | None = None
    """How an infill prompt lays the file out (runtime/prompting.py); None is the default layout."""


class Region(msgspec.Struct, frozen=True):
    """A half-open span [start, end) of str offsets in the document."""

    start: int
    """First offset in the span."""
    end: int
    """Offset one past the span."""


class HolePlan(msgspec.Struct, frozen=True, kw_only=True):
    """What hole the infill fills at the cursor, and where it must stop."""

    kind: Literal["block", "expression", "line", "statement", "text"]
    """block: an empty body; expression: inside brackets whose closer is right of the
    cursor; line: finish the current line; statement: new statements on a blank line
    among others; text: no grammar (plain-text fallback)."""
    region: Region
    """The span the infill may cover: starts at the cursor, ends where the stop rule says."""
    stop: str
    """The stop rule, by name (e.g. "before-closer", "end-of-line", "end-of-block",
    "before-next-statement", "max-lines")."""
    indent: str = ""
    """Indentation the inserted lines must carry (the cursor's block)."""
    max_lines: int | None = None
    """At most this many lines of infill, or None for no line cap."""
    closer: str | None = None
    """For expression holes: the bracket that closes the hole, already in the document."""


class CrossFileSnippet(msgspec.Struct, frozen=True, kw_only=True):
    """Code from another workspace file, shown to the model before the file (engine/crossfile/)."""

    path: str
    """The file's path relative to the workspace root (or as given when outside it)."""
    start_line: int
    """First line shown, 0-based."""
    end_line: int
    """Line one past the last line shown, 0-based."""
    source: Literal["definition", "open-document", "recent", "editor"]
    """definition: what a name near the cursor resolves to (signatures, docstrings, fields);
    open-document: the window of another open file most like the code at the cursor;
    recent: a range recently edited or viewed in another file;
    editor: the header of a definition the editor's other language servers found for a name near
    the cursor (engine/crossfile/editor.py)."""
    score: float
    """How strongly it was chosen (its source's own scale; higher is better)."""
    tokens: int
    """Estimated tokens of `text`."""
    text: str
    """What the prompt shows (definitions: bodies elided)."""
    shown_path: str = ""
    """How the prompt's heading names the file ("": `path`): relative to the folder of the file
    being completed when it is inside that folder (engine/crossfile/gather.py `shown_path`)."""

    @property
    def heading(self) -> str:
        """The file's name in the prompt's heading."""
        return self.shown_path or self.path


class InfillContext(msgspec.Struct, frozen=True, kw_only=True):
    """The text the prompt is built from: a window around the cursor under a token budget."""

    prefix: str
    """Code before the cursor, cut at a syntactic boundary."""
    suffix: str
    """Code after the cursor, cut at a syntactic boundary."""
    preamble: str = ""
    """Context that did not fit whole: imports, enclosing scope headers, sibling signatures."""
    language: str = "plaintext"
    """Normalized language id (python, javascript, typescript, tsx, go, rust, c, cpp, java, lua, plaintext)."""
    tokens: int = 0
    """Estimated tokens of preamble + prefix + suffix."""
    cross_file: tuple[CrossFileSnippet, ...] = ()
    """Snippets from other workspace files, shown before the file in the prompt's stable part;
    their tokens are counted apart from `tokens` (a budget of their own)."""


class DenoiseRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One job for the denoiser: an infill at a cursor, or a rewrite of a selection."""

    context: InfillContext
    """Prefix/suffix around the hole (for a rewrite: around the selection)."""
    settings: GenerationSettings = GenerationSettings()
    """Denoising knobs."""
    cache_key: str | None = None
    """Key of the prompt cache (usually the document URI); None disables reuse."""
    selection: str | None = None
    """Rewrite only: the selected text, which becomes the starting canvas."""
    strength: float = 1.0
    """Rewrite only: renoising strength in (0, 1]; 1 is a fresh infill."""
    priority: int = 0
    """Scheduling priority in a shared engine: higher runs first (keystrokes > speculative work)."""
    rewrite_keep: Literal["canvas", "prompt", "both"] = "canvas"
    """Rewrite only: how the selection's kept tokens stay visible to the model for the whole run:
    "canvas" pins them in the canvas, "prompt" writes the original selection into the prompt,
    "both" does both (engine/runtime/rewriting.py)."""
    recent_edits: str | None = None
    """Next edit only (a rewrite of the edit window): the user's recent edits as unified diffs, shown
    in the prompt, which asks for the edit that follows them (engine/nextedit/, runtime/prompting.py)."""


class Draft(msgspec.Struct, frozen=True, kw_only=True):
    """The argmax canvas of the first candidate after one denoising step."""

    step: int
    """1-based index of the step across all canvases of the request."""
    text: str
    """Decoded text so far (earlier finished canvases + this canvas up to EOS)."""


class RawCandidate(msgspec.Struct, frozen=True, kw_only=True):
    """A denoised answer before post-processing."""

    text: str
    """Decoded middle, special tokens removed, cut at EOS."""
    confidence: float
    """Mean over answer tokens of the top-token probability at the last step, in [0, 1]."""
    tokens: int
    """Number of answer tokens (before EOS)."""


class Timings(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Milliseconds spent in each phase of one request."""

    load: float = 0.0
    """Model load (0 when already resident)."""
    prompt: float = 0.0
    """Tokenizing and encoding the prompt (only the changed tail on a cache hit)."""
    denoise: float = 0.0
    """All denoising steps."""
    total: float = 0.0
    """Wall time of the whole request inside the engine."""


class DenoiseResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The denoiser's answer to one DenoiseRequest."""

    candidates: list[RawCandidate]
    """One per requested candidate, in batch order."""
    steps: int
    """Denoising steps run (all canvases)."""
    tokens_per_forward: float
    """Answer tokens per decoder forward pass, averaged over candidates."""
    drafts: int
    """Draft callbacks made (one per step)."""
    canvases: int
    """Canvases denoised."""
    prompt_tokens: int
    """Tokens in the whole prompt."""
    cached_prompt_tokens: int
    """Prompt tokens served from the prompt cache (not re-encoded)."""
    timings_ms: Timings
    """Per-phase timings."""


class Candidate(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A finished answer, ready to insert at the cursor."""

    text: str
    """Text to insert at the cursor."""
    confidence: float
    """The model's confidence (see RawCandidate.confidence)."""
    syntax_ok: bool | None = None
    """True when prefix + text + suffix adds no ERROR/MISSING nodes; None without a grammar."""
    replace_chars: int = 0
    """Characters right of the cursor that the text replaces (e.g. an auto-closed bracket)."""


class EngineStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine is doing, for status bars and `engine status`."""

    state: Literal["idle", "loading", "ready", "busy", "error", "unloaded"]
    """Lifecycle state."""
    model: str
    """Model spec as given (`tiny`, a folder, or a hub id)."""
    device: str = ""
    """torch device the model runs on, once loaded."""
    message: str = ""
    """Human-readable detail, e.g. why loading failed."""
    loads: int = 0
    """How many times the model was loaded in this process."""
    memory_bytes: int = 0
    """Bytes of parameters and buffers resident for the model."""
    last_latency_ms: float | None = None
    """Total time of the last finished request."""
    progress: float | None = None
    """While loading: the fraction of checkpoint shards read, in [0, 1]; None when not known or not loading."""
    prompt_cache_bytes: int = 0
    """Bytes of prompt-cache snapshots kept on the model's device."""
    cancelled: int = 0
    """Requests this engine stopped on a cancel before their last step, since it started (a
    request that finished before its cancel was seen is not counted)."""
    context_tokens: int | None = None
    """The most prompt context the model reads well, in the context budget's tokens (its
    folder's `dgemma_context_tokens`, prompting.MODEL_CONTEXT_KEY); None: no limit. A model trained on
    short contexts writes noise past them, so the server cuts every request's budget to this. Known before the
    model loads (read from its folder), so a request made during the load is cut too."""
