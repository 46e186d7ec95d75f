"""Training examples shaped like the product's real requests: a hole cut out of real code, the prompt
the server would build for it, and the canvas the model should write.

A hole is chosen the way the syntax planner's kinds describe them (engine/syntax/planning.py):
- line: the rest of a line after a token boundary;
- expression: the text between a bracket's opener side and its closer on the same line;
- statement: a whole statement among siblings (its line keeps its indentation);
- block: every statement of a body (the header and, for braces, the `{ }` stay);
- lines: the rest of a line and the 1-3 lines after it (a multi-line hole that ignores
  syntax, as HumanEval's multi-line infilling does);
- span: from a token boundary of a code line, exactly as many tokens as the canvas holds
  before its end-of-turn (issue 28: every canvas position is an answer token, so the decoder
  learns to write from the prompt ~6x faster per example than from the product's short holes;
  the nearest thing to plain continuation that keeps the product's prompt).
A recipe's `kindWeights` sets the mix (default KIND_WEIGHTS; "lines" and "span" only when named).
The hole is removed, and the product's own pipeline builds the prompt: `prepare_infill`
(planner + context window) and `PromptBuilder` (chat template, instruction, <CURSOR>), in
the natural layout or, for a recipe's `suffixFirstShare` of examples, the suffix-first one.
The target canvas is the removed text's tokens, the chat template's end-of-turn token,
then pad: exactly what a finished answer looks like in `generate`'s canvas.

Deterministic: example `i` of a run depends only on (seed, i). Knows tree-sitter, the
tokenizer and the prompt layout; knows nothing of torch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..api import GenerationSettings
from ..model.prompting import PromptBuilder
from ..syntax.brackets import CLOSERS, OPENERS, code_chars
from ..syntax.document import SyntaxDocument
from ..syntax.infill import prepare_infill
from ..syntax.languages import BLOCK_TYPES
from .corpus import CodeFile

KINDS = ("line", "expression", "statement", "block", "lines", "span")
KIND_WEIGHTS = (0.4, 0.2, 0.25, 0.15, 0.0, 0.0)
"""Line holes dominate typing; the others follow how often an editor asks for them."""


@dataclass(frozen=True)
class Hole:
    kind: str
    start: int
    end: int


@dataclass(frozen=True)
class Example:
    """One training example: token ids of the prompt and of the clean canvas."""

    kind: str
    prompt_ids: list[int]
    canvas_ids: list[int]
    """Exactly canvas_length ids: the middle, the end-of-turn id, then pad."""
    middle: str


class ExampleMaker:
    """Turns code files into Examples for one tokenizer and canvas length."""

    def __init__(self, tokenizer, canvas_length: int, *, max_prompt_tokens: int, context_tokens=(64, 512),
                 suffix_first_share: float = 0.0, kind_weights: dict[str, float] | None = None,
                 layout: str | None = None):
        self.tokenizer = tokenizer
        self.kind_weights = KIND_WEIGHTS if kind_weights is None else tuple(kind_weights.get(k, 0.0) for k in KINDS)
        assert sum(self.kind_weights) > 0, f"kindWeights names none of {KINDS}"
        self.suffix_first_share = suffix_first_share
        """Share of examples laid out suffix-first (prompting.PROMPT_LAYOUTS), the rest natural."""
        self.layout = layout
        """Every example in this layout, with no draw (validation compares layouts on the same holes)."""
        self.builder = PromptBuilder(tokenizer)
        self.canvas_length = canvas_length
        self.max_prompt_tokens = max_prompt_tokens
        self.context_tokens = context_tokens
        self.end_id = end_of_turn_id(tokenizer)
        self.pad_id = tokenizer.pad_token_id

    def make(self, file: CodeFile, rng: random.Random, tries: int = 8) -> Example | None:
        """One example from `file`, or None when no hole that fits the canvas was found in `tries`."""
        return self._from_document(SyntaxDocument(file.text, file.language), rng, tries)

    def make_many(self, file: CodeFile, rng: random.Random, count: int, tries: int = 8) -> list[Example]:
        """Up to `count` examples from `file`, its parse shared (packing.py): each as `make` would cut it.

        A file's parse and its block nodes are half of what an example costs to cut (issue 51's profile);
        the holes' own prompts are built from the text around each hole, as in `make`."""
        doc = SyntaxDocument(file.text, file.language)
        found = []
        for _ in range(count):
            example = self._from_document(doc, rng, tries, incremental=True)
            if example is None:  # `tries` holes of this file did not fit: the next ones would hardly do better
                break
            found.append(example)
        return found

    def _from_document(self, doc: SyntaxDocument, rng: random.Random, tries: int,
                       incremental: bool = False) -> Example | None:
        for _ in range(tries):
            kind = rng.choices(KINDS, self.kind_weights)[0]
            hole = choose_hole(doc, kind, rng)
            if hole is None:
                continue
            example = self._example(doc, hole, rng, incremental)
            if example is not None:
                return example
        return None

    def _example(self, doc: SyntaxDocument, hole: Hole, rng: random.Random, incremental: bool = False) -> Example | None:
        if hole.kind == "span":
            hole = self._fill_canvas(doc.text, hole)
        middle = doc.text[hole.start:hole.end]
        middle_ids = self.tokenizer(middle, add_special_tokens=False)["input_ids"]
        if not middle.strip() or len(middle_ids) > self.canvas_length - 1:
            return None
        if incremental:  # the hole deleted from a copy of the parsed file, as an editor's keystroke is reparsed
            around = doc.snapshot()
            around.apply_change(hole.start, hole.end, "")
        else:
            around = SyntaxDocument(doc.text[:hole.start] + doc.text[hole.end:], doc.language)
        budget = rng.randint(*self.context_tokens)
        prepared = prepare_infill(around, hole.start, GenerationSettings(), budget_tokens=budget)
        # No draw when every example is natural: a recipe without the mix keeps its exact stream.
        if self.layout is not None:
            layout = self.layout
        else:
            suffix_first = self.suffix_first_share > 0 and rng.random() < self.suffix_first_share
            layout = "suffix-first" if suffix_first else "natural"
        prompt_ids = self.builder.build(prepared.context, layout=layout).all
        if len(prompt_ids) > self.max_prompt_tokens:
            return None
        canvas = middle_ids + [self.end_id]
        canvas += [self.pad_id] * (self.canvas_length - len(canvas))
        return Example(kind=hole.kind, prompt_ids=prompt_ids, canvas_ids=canvas, middle=middle)


    def _fill_canvas(self, text: str, hole: Hole) -> Hole:
        """The span hole cut down to the canvas: its first canvas_length - 1 tokens (a token's end, by offsets)."""
        window = text[hole.start:hole.end]
        offsets = self.tokenizer(window, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        keep = offsets[: self.canvas_length - 1]
        return Hole("span", hole.start, hole.start + (keep[-1][1] if keep else 0))


def end_of_turn_id(tokenizer) -> int:
    """The token the chat template closes a turn with (`<turn|>` for Gemma), read off the template."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "\x00"}], tokenize=False
    )
    after_answer = rendered.split("\x00", 1)[1]
    ids = tokenizer(after_answer, add_special_tokens=False)["input_ids"]
    assert ids, "the chat template writes nothing after an answer: no end-of-turn token"
    return ids[0]


def choose_hole(doc: SyntaxDocument, kind: str, rng: random.Random) -> Hole | None:
    """A random hole of `kind` in `doc`, or None when this document has none (or the pick missed)."""
    if kind == "line":
        return _line_hole(doc.text, rng)
    if kind == "expression":
        return _expression_hole(doc.text, rng)
    if kind == "lines":
        return _lines_hole(doc.text, rng)
    if kind == "span":  # ExampleMaker cuts it to the canvas by tokens; 16 characters a token is plenty
        first = _line_hole(doc.text, rng)
        return None if first is None else Hole("span", first.start, min(len(doc.text), first.start + 4096))
    if doc.tree is None:
        return None
    blocks = _block_nodes(doc)
    if not blocks:
        return None
    node = rng.choice(blocks)
    children = [c for c in node.named_children if c.type != "comment"]
    if not children:
        return None
    if kind == "statement":
        siblings = [c for c in children[:-1] if _starts_line(doc, c)]
        if not siblings:
            return None
        child = rng.choice(siblings)
        return Hole("statement", *_span(doc, child, child))
    if node.parent is None or not _starts_line(doc, children[0]):
        return None
    return Hole("block", *_span(doc, children[0], children[-1]))


def _block_nodes(doc: SyntaxDocument) -> list:
    """Every node whose named children are statements, the root excepted (kept in the document's memo:
    walking a big file's tree in Python costs as much as parsing it, and a file gives several holes)."""
    memo = doc.memo.get("training.blocks")
    if memo is not None and memo[0] == doc.revision:
        return memo[1]
    found = _find_block_nodes(doc)
    doc.memo["training.blocks"] = (doc.revision, found)
    return found


def _find_block_nodes(doc: SyntaxDocument) -> list:
    types = BLOCK_TYPES.get(doc.language, frozenset())
    found, stack = [], [doc.tree.root_node]
    while stack:
        node = stack.pop()
        if node.type in types and node.parent is not None:
            found.append(node)
        stack.extend(node.named_children)
    if not found:  # a file of top-level statements only: the root's children are statements too
        found.append(doc.tree.root_node)
    return found


def _starts_line(doc: SyntaxDocument, node) -> bool:
    start, _ = doc.node_span(node)
    line_start = doc.text.rfind("\n", 0, start) + 1
    return not doc.text[line_start:start].strip()


def _span(doc: SyntaxDocument, first, last) -> tuple[int, int]:
    start, _ = doc.node_span(first)
    _, end = doc.node_span(last)
    line_end = doc.text.find("\n", end)
    # Up to the end of the last line (a trailing `;` or comment goes too), never the newline.
    return start, (len(doc.text) if line_end < 0 else line_end) if not doc.text[end:line_end].strip() else end


def _lines(text: str) -> list[tuple[int, str]]:
    lines, offset = [], 0
    for line in text.split("\n"):
        lines.append((offset, line))
        offset += len(line) + 1
    return lines


def _code_lines(text: str) -> list[tuple[int, str]]:
    return [(o, s) for o, s in _lines(text) if len(s.strip()) >= 2 and not s.lstrip().startswith(("#", "//", "--"))]


def _boundaries(line: str, start: int, end: int) -> list[int]:
    """Columns in [start, end) where a token ends or begins: where the cursor usually stands."""
    return [i for i in range(start, end)
            if not (line[i - 1].isalnum() or line[i - 1] == "_") or not (line[i].isalnum() or line[i] == "_")]


def _line_hole(text: str, rng: random.Random) -> Hole | None:
    lines = _code_lines(text)
    if not lines:
        return None
    offset, line = rng.choice(lines)
    indent = len(line) - len(line.lstrip())
    code_end = len(line.rstrip())
    columns = _boundaries(line, indent + 1, code_end)
    if not columns:
        return None
    column = rng.choice(columns)
    return Hole("line", offset + column, offset + len(line))


def _lines_hole(text: str, rng: random.Random) -> Hole | None:
    """From a token boundary of a code line to the end of the 1-3 lines after it."""
    first = _line_hole(text, rng)
    if first is None:
        return None
    end = first.end
    for _ in range(rng.randint(1, 3)):
        following = text.find("\n", end + 1)
        if end >= len(text):
            break
        end = len(text) if following < 0 else following
    end = len(text[:end].rstrip())  # never end on blank lines
    return Hole("lines", first.start, end) if "\n" in text[first.start:end] else None


def _expression_hole(text: str, rng: random.Random) -> Hole | None:
    lines = _code_lines(text)
    rng.shuffle(lines)
    for offset, line in lines[:16]:
        pairs, stack = [], []
        for i, c in code_chars(line):
            if c in OPENERS:
                stack.append(i)
            elif c in CLOSERS and stack:
                opener = stack.pop()
                if i > opener + 1:
                    pairs.append((opener, i))
        if pairs:
            opener, closer = rng.choice(pairs)
            columns = [opener + 1] + _boundaries(line, opener + 2, closer)
            column = rng.choice(columns)
            if line[column:closer].strip():
                return Hole("expression", offset + column, offset + closer)
    return None
