"""Picks the cross-file snippets one prompt shows, under their own token budget.

Sources, in this order of the budget: definitions (what the file's imports resolve to, every
other file of a Go package, the file's own folder; scored by the names and words of the code
near the cursor: a name used there scores high, then a name the file imports, words shared with
it, rare words weighing more; the module the code near the cursor reaches through its alias
(`events.`); members of the type the cursor's code belongs to and of its bases, and of types named
near the cursor; names that other workspace files mention often, and those that the linked files
most like this one mention; names that the linked files' windows most like the code around the
cursor's line use, and names that come with the names near the cursor in all their windows, more
than they come anywhere (windows.py); of another Go package, its exported names only; a name the
file already mentions weighs a fifth, since the model sees it in use, while a name the file never
mentions it cannot write without its definition), the most similar window of each other open
document of the same language, and recently edited or viewed ranges of other files. Definitions
are ranked by score per token (its square root) and packed as one-line signatures (a type or class
as its header line; a member as its first line, except in Python) first, one definition a name
(a twin in another file says nothing new; constructors are kept per type); what is left of the
budget then shows fields and doc lines, best first. Never a body.

Stable while the user types on one line: the snippets depend only on the code near the
cursor *outside* its line (the context's prefix up to the cursor's line and its suffix
after it, and the file's names less those of the cursor's line) and on the other files' state, and a request with all of those unchanged gets
the very same tuple back (memoized), so the prompt's stable part, which they lead, keeps
its cache. Nothing the window already shows is picked (snippets come from other files only).
Knows the index and the engine's types; knows nothing of tree-sitter trees, torch or LSP.
"""

from __future__ import annotations

import bisect
import math
import os
import re
from collections import Counter, OrderedDict
from collections.abc import Callable

from ..api import CrossFileSnippet, InfillContext
from ..syntax.context import approx_token_count
from .index import WorkspaceIndex
from .neighbours import OpenFile, RecentRanges, SimilarWindows, identifiers
from .outline import Definition, words_of
from .resolve import Link, resolve_imports
from .windows import FileWindows

OPEN_DOCUMENT_SHARE = 0.25
"""Of the cross-file budget, kept for similar windows of open documents (when there are any)."""
RECENT_SHARE = 0.15
"""Of the cross-file budget, kept for recent ranges (when there are any)."""
NEAR_LINES = 6
"""Lines before the cursor's line whose words count double (the code the answer continues)."""
WORD_LINES_BEFORE = 40
WORD_LINES_AFTER = 10
"""Lines around the cursor's line whose words retrieval matches (further code says less about the next line)."""
SIBLING_WEIGHT = 0.5
"""Scores of the definitions of the other files in the file's folder that it does not import."""
RECENT_CONTEXT_LINES = 4
"""Lines shown either side of a recent line."""
USED_BONUS = 2.0
"""Score of a definition whose name the code near the cursor uses (its signature helps the call)."""
IMPORTED_BONUS = 1.0
"""Score of a definition the file imports by name."""
AFFINITY = 0.3
"""Score per name of its module (x2: of its type) that the code near the cursor uses, up to 5."""
LOCALITY = 0.4
"""Score of a definition right next to one the code near the cursor uses (less further away)."""
LOCALITY_LINES = 60
"""How far (in lines) locality reaches."""
MAX_MISSES = 64
"""Definitions too big for what is left of the budget before the choice stops looking."""
MAX_LINKED_FILES = 40
MAX_GO_PACKAGE_FILES = 120
"""Files of a Go package whose definitions compete (its files share one namespace)."""
TEST_WEIGHT = 0.3
"""Scores of a test file's definitions (code outside tests rarely calls them)."""
"""Files whose definitions compete for one prompt (the file's imports first, then theirs)."""
SECOND_HAND_WEIGHT = 0.5
"""Scores of the definitions of a file that an imported file imports."""
RECEIVER_BONUS = 1.5
"""Score of a member of the type the cursor's code belongs to (or of one of its bases)."""
ALIAS_BONUS = 1.5
"""Score of a top-level definition of a module that the code near the cursor reaches through its
alias (`events.get_running_loop()`, `_bootstrap._setup(...)`): the next line likely does too."""
NAMED_TYPE_BONUS = 0.75
"""Score of a member of a type whose name the code near the cursor uses."""
MENTIONED_WEIGHT = 0.2
"""Scores of a definition whose name the file already mentions: the model sees it in use already,
while a name the file never mentions it cannot write without its definition."""
POPULARITY = 0.5
"""Score per log of the other workspace files that mention a definition's name (what many files use,
this one likely uses too)."""
COUSE = 2.0
"""Score of a definition by the share of the linked files most like this one (in the names they
mention) that mention its name without defining it, while this file does not: files that use what
this one uses use it too."""
COUSE_FILES = 8
"""The files most like this one that COUSE counts."""
DENSITY = 0.5
"""The choice ranks definitions by score / tokens ** DENSITY."""
WINDOW_BONUS = 12.0
"""Score of a definition by the similarity (0-1) to the lines around the cursor's line of the most
similar window of the linked files that uses its name (in it or in the two lines after it): code
like this code elsewhere in the package uses it (windows.py)."""
ALONGSIDE_BONUS = 2.0
"""Score of a definition per unit of how much more than anywhere its name comes with the names near
the cursor, in all the linked files' windows (windows.py's `names_alongside`)."""
_MEMO_SIZE = 32
MAX_COSTS = 200_000
"""Remembered signature costs before they are forgotten (at an index change)."""


class _Request:
    """What one choice depends on: the code around the cursor outside its line (`near`, hashed), and
    everything else (`surroundings`: language, budget, the other files' state, the recent ranges)."""

    __slots__ = ("before", "after", "line", "others", "recent", "key")

    @classmethod
    def of(cls, sources: CrossFileSources, path: str, language: str, context: InfillContext,
           budget: int) -> _Request:
        request = cls()
        request.before = context.prefix[: context.prefix.rfind("\n") + 1]
        newline = context.suffix.find("\n")
        request.after = context.suffix[newline + 1:] if newline >= 0 else ""
        # The names of the file as the index has it (the editor's buffer), less those of the cursor's
        # line (what is being typed there must not change the choice).
        request.line = context.prefix[len(request.before):] + (context.suffix[:newline] if newline >= 0
                                                                else context.suffix)
        request.others = [f for f in sources.open_files() if f.path != path and f.language == language]
        request.recent = sources.recent.others(path)
        index = sources.index
        surroundings = (language, budget, index.generation_without(path) if index is not None else 0,
                        tuple((f.path, f.revision) for f in request.others), request.recent)
        request.key = (surroundings, hash(request.before), hash(request.after))
        return request


class CrossFileSources:
    """The index, the open documents and the recent ranges of one session, and the choice among them."""

    def __init__(self, index: WorkspaceIndex | None, open_files: Callable[[], list[OpenFile]] | None = None,
                 recent: RecentRanges | None = None) -> None:
        self.index = index
        self.open_files = open_files or (lambda: [])
        self.recent = recent or RecentRanges()
        self.windows = SimilarWindows()
        self.file_windows = FileWindows()
        self._memo: OrderedDict[str, tuple[tuple, tuple[CrossFileSnippet, ...]]] = OrderedDict()
        self._links: dict[str, tuple[int, object, list]] = {}
        self._weights_generation = -1
        self._idf: dict[str, float] = {}
        self._totals: dict[int, float] = {}
        """id(definition) -> its words' total weight (the index keeps the definitions alive)."""
        self._costs: dict[tuple[int, bool, bool], tuple[Definition, int]] = {}
        """Rendered tokens per (id(definition), header only, with doc); the definition is kept with its
        cost (so its id is not reused while the entry lives): they outlive index generations."""
        self._use_sets: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {}
        """Per file: its names as a set (kept while the index holds the same tuple)."""
        self._own: dict[str, tuple[object, frozenset[str]]] = {}
        """Per file: the names it defines (kept while the index holds the same outline)."""
        self._compact: dict[int, tuple[Definition, float]] = {}
        """id(definition) -> (it, its one-line cost ** DENSITY), what the ranking divides by."""

    def snippets(self, path: str | None, language: str, context: InfillContext,
                 budget: int) -> tuple[CrossFileSnippet, ...]:
        """The snippets for a prompt of the file at `path` whose window is `context`, within `budget` tokens."""
        if budget <= 0:
            return ()
        path = os.path.abspath(path) if path else ""
        request = _Request.of(self, path, language, context, budget)
        memo = self._memo.get(path)
        if memo is not None and memo[0] == request.key:
            return memo[1]
        chosen = self._choose(path, language, request.before, request.after, request.others, request.recent, budget,
                              identifiers(request.line))
        self._memo[path] = (request.key, chosen)
        self._memo.move_to_end(path)
        while len(self._memo) > _MEMO_SIZE:
            self._memo.popitem(last=False)
        return chosen

    def key(self, path: str | None, language: str, context: InfillContext, budget: int) -> tuple | None:
        """What the choice for this prompt depends on, hashed: equal keys, equal choices."""
        if budget <= 0:
            return None
        path = os.path.abspath(path) if path else ""
        return _Request.of(self, path, language, context, budget).key

    def known(self, path: str | None, key: tuple | None) -> tuple[tuple[CrossFileSnippet, ...], bool] | None:
        """The file's memoized choice when it was made with everything but the code around the cursor
        alike (`key`'s surroundings: budget, language, the other files, the recent ranges), and whether
        it was made for this very place (`key` whole); None when there is none. No choosing here: what
        the server shows while the user types across lines, until a pause (server/workspace.py)."""
        if key is None:
            return (), True
        memo = self._memo.get(os.path.abspath(path) if path else "")
        if memo is None or memo[0][0] != key[0]:
            return None
        return memo[1], memo[0] == key

    # -- choosing --------------------------------------------------------------------------------

    def _choose(self, path: str, language: str, before: str, after: str, others: list[OpenFile],
                recent: tuple, budget: int, cursor_line: frozenset[str] = frozenset()) -> tuple[CrossFileSnippet, ...]:
        query = identifiers("\n".join(before.split("\n")[-WINDOW_QUERY_LINES:]))
        similar = self.windows.best(others, query) if others else []
        texts = {f.path: f.text for f in others}
        reserve_open = int(budget * OPEN_DOCUMENT_SHARE) if similar else 0
        recent_here = [e for e in recent if e[0] in texts or self._open_text(e[0]) is not None]
        reserve_recent = int(budget * RECENT_SHARE) if recent_here else 0
        picked: list[CrossFileSnippet] = []
        shown: dict[str, list[tuple[int, int]]] = {}
        here = self.index.relative(path) if self.index is not None else path
        spent = self._definitions(path, before, after, budget - reserve_open - reserve_recent, picked, shown,
                                  cursor_line)
        left = budget - spent
        spent_open = 0
        for file, start, end, score in similar[:4]:
            lines = file.text.split("\n")[start:end]
            text = "\n".join(lines).strip("\n")
            cost = self._cost(text, file.path, shown, here)
            if not text or _overlaps(shown, file.path, start, end) or spent_open + cost > min(left, max(
                    reserve_open, left - reserve_recent)):
                continue
            spent_open += cost
            picked.append(self._snippet(file.path, start, end, "open-document", score, text, here))
            shown.setdefault(file.path, []).append((start, end))
        left -= spent_open
        for rank, (other, line, _kind) in enumerate(recent_here):
            text_of = texts.get(other) or self._open_text(other) or ""
            lines = text_of.split("\n")
            start, end = max(0, line - RECENT_CONTEXT_LINES), min(len(lines), line + RECENT_CONTEXT_LINES + 1)
            text = "\n".join(lines[start:end]).strip("\n")
            cost = self._cost(text, other, shown, here)
            if not text.strip() or _overlaps(shown, other, start, end) or cost > left:
                continue
            left -= cost
            picked.append(self._snippet(other, start, end, "recent", 1.0 / (1 + rank), text, here))
            shown.setdefault(other, []).append((start, end))
        return tuple(picked)

    def _open_text(self, path: str) -> str | None:
        for file in self.open_files():
            if file.path == path:
                return file.text
        return None

    def _definitions(self, path: str, before: str, after: str, budget: int, picked: list,
                     shown: dict, cursor_line: frozenset[str] = frozenset()) -> int:
        index = self.index
        if index is None or budget <= 0 or path not in index.files:
            return 0
        language = index.files[path].language
        directory = os.path.dirname(path)
        here = index.relative(path)
        links = self._linked(path)
        if not links:
            return 0
        self._weights()
        near_names = Counter(identifiers(before + after))
        qualifiers = _qualifiers(before, after)
        near_weight: Counter[str] = Counter()
        before_lines = before.split("\n")
        for lines, weight in ((before_lines[-WORD_LINES_BEFORE - 1:], 1.0), (after.split("\n")[:WORD_LINES_AFTER], 1.0),
                              (before_lines[-NEAR_LINES - 1:], 1.0)):
            for word in words_of("\n".join(lines)):
                near_weight[word] += weight
        scored: list[tuple[float, int, str, Definition, list[tuple[float, Definition]]]] = []
        order = 0
        # Affinity: a type whose members the code near the cursor already uses (`msg.get_payload()`)
        # likely has the member the next line needs; likewise a module whose names it uses.
        type_affinity: Counter[str] = Counter()
        for link, _weight in links:
            outline = index.files.get(link.path)
            for definition in outline.definitions if outline is not None else ():
                if definition.parent is not None and definition.name in near_names:
                    type_affinity[definition.parent] += 1
        # The type the cursor's code is a member of (Go's receiver, the enclosing class) and its
        # bases: `self.x()` / `t.x()` call members of these; then types named near the cursor
        # (a parameter's type), whose members the code reaches through that parameter.
        outlines = [index.files[link.path] for link, _weight in links if link.path in index.files]
        receiver = _enclosing_types(before, language, outlines)
        mentioned = (set(index.uses.get(path, ())) - cursor_line) | set(near_names)
        # Not in Go: a package's files share one namespace and all of them are peers (measured worse).
        couse = self._couse(path, mentioned, [link.path for link, _weight in links]) if language != "go" else {}
        # The names that code like the lines around the cursor's line uses elsewhere in the package.
        linked = [(link.path, index.files[link.path]) for link, _weight in links if link.path in index.files]
        open_texts = {f.path: f.text for f in self.open_files()}
        followed = self.file_windows.names_near(before, linked, self._rarity, after, open_texts)
        # The names that come with the names near the cursor wherever the package uses them.
        alongside = self.file_windows.names_alongside(
            before, linked, self._rarity, after, frozenset(d.name for _path, outline in linked for d in outline.definitions),
            open_texts)
        for link, weight in links:
            outline = index.files.get(link.path)
            if outline is None:
                continue
            used = sum(1 for d in outline.definitions if d.parent is None and d.name in near_names)
            used += 2 if link.alias and link.alias in near_names else 0  # `utils.` near the cursor
            used = AFFINITY * min(used, 5)
            through = _alias_uses(link, qualifiers)
            through = ALIAS_BONUS * math.sqrt(min(through, 4)) if through else 0.0
            tops: dict[str, tuple[float, Definition]] = {}
            members: dict[str, list[tuple[float, Definition]]] = {}
            # Locality: helpers are defined near what they help; lines of the definitions used near
            # the cursor, whose neighbours in their file score up.
            anchors = sorted(d.start_line for d in outline.definitions if d.name in near_names)
            # Another Go package: only its exported names can be used from here.
            exported_only = language == "go" and os.path.dirname(link.path) != directory
            for definition in outline.definitions:
                if exported_only and not definition.name[:1].isupper():
                    continue
                score = self._similarity(definition, near_weight) + used
                users = index.users(definition.name) - 1
                if users > 0 and definition.name not in mentioned:
                    score += POPULARITY * math.log(1 + users) + COUSE * couse.get(definition.name, 0.0)
                if anchors:
                    score += LOCALITY * _closeness(anchors, definition.start_line)
                if definition.name in near_names:
                    score += USED_BONUS
                score += WINDOW_BONUS * followed.get(definition.name, 0.0)
                score += ALONGSIDE_BONUS * alongside.get(definition.name, 0.0)
                if definition.name in link.names:
                    score += IMPORTED_BONUS
                if definition.parent is None:
                    score += through
                if definition.parent is not None:
                    score += 2 * AFFINITY * min(type_affinity[definition.parent], 5)
                    if definition.parent in receiver:
                        score += RECEIVER_BONUS
                    elif definition.parent in near_names:
                        score += NAMED_TYPE_BONUS
                if definition.name in mentioned:
                    score *= MENTIONED_WEIGHT
                score *= weight
                if definition.parent is None:
                    tops[definition.name] = (score, definition)
                else:
                    members.setdefault(definition.parent, []).append((score, definition))
            for parent, group in members.items():
                # A member of a type defined elsewhere (a Go method in another file of the package):
                # it stands alone, with its receiver's name as the header.
                if parent not in tops:
                    for score, member in group:
                        order += 1
                        scored.append((score, order, link.path, member, []))
            for name, (score, definition) in tops.items():
                group = members.get(name, [])
                bonus = 0.5 * score
                order += 1
                scored.append((score, order, link.path, definition,
                               [(bonus + member_score, member) for member_score, member in group]))
        # Best first: a definition alone, or a type with the members that score above it; members
        # of a chosen type may also come in on their own score later (as items of their own).
        items: list[tuple[float, int, str, Definition, Definition | None]] = []
        for score, order, file, definition, group in scored:
            items.append((score, order, file, definition, None))
            for member_score, member in group:
                items.append((member_score, order, file, member, definition))
        # Score per token (a square root of it: a long signature is worth more than a short one, not
        # in proportion): the budget buys the most likely definitions.
        compact = self._compact
        languages = {file: index.files[file].language for file in {item[2] for item in items}}

        def density(item) -> tuple[float, int]:
            entry = compact.get(id(item[3]))
            if entry is None or entry[0] is not item[3]:
                language = languages[item[2]]
                entry = compact[id(item[3])] = (item[3], self._cost_of(item[3], language, _first_line(item[4] is None, language),
                                                                       False) ** DENSITY)
            return -item[0] / entry[1], item[1]

        items.sort(key=density)
        # Signatures first, one line each (a type's or class's header alone): as many definitions as
        # fit; then, best first, what is left of the budget shows their fields and doc lines.
        # (file, top start line) -> [top, score, members, whole, detail, headed]
        chosen: dict[tuple[str, int], list] = {}
        spent = misses = 0
        # One definition a name: its twin in another file (a Go build-tag variant, the same method of
        # another class, a platform's version) says what the first one said, at the same cost. Not a
        # constructor's (`__init__`, `constructor`, `new`): each type's says how to make that type.
        named: set[tuple[str, str | None]] = set()
        for score, _order, file, definition, parent in items:
            if score <= 0.05:
                break
            twin = _twin_key(definition)
            if twin in named:
                continue
            top = parent or definition
            slot = chosen.get((file, top.start_line))
            if slot is not None and (slot[5] if parent is None else any(m[0] is definition for m in slot[2])):
                continue
            if _overlaps(shown, file, top.start_line, top.end_line) and slot is None:
                continue
            language = index.files[file].language
            cost = self._cost_of(definition, language, _first_line(parent is None, language), False)
            headed = parent is None or not _receiver_names_type(language)
            if slot is None:
                if parent is not None and headed:
                    cost += self._cost_of(parent, language, True, False)
                if file not in shown and not any(k[0] == file for k in chosen):
                    cost += self._heading(file, here)
            if spent + cost > budget:
                misses += 1
                if misses > MAX_MISSES or budget - spent < 8:
                    break  # nothing small enough is likely to come: the rest is the tail of the ranking
                continue
            spent += cost
            named.add(twin)
            if slot is None:
                slot = chosen[(file, top.start_line)] = [top, score, [], parent is None, False, headed]
            elif parent is None:  # a Go type whose methods came first, without it
                slot[3] = slot[5] = True
            if parent is not None:
                slot[2].append([definition, score, False])
        details = []
        for key, slot in chosen.items():
            if slot[5]:
                details.append((slot[1], key[0], slot, None))
            for member in slot[2]:
                details.append((member[1], key[0], slot, member))
        details.sort(key=lambda d: -d[0])
        for _score, file, slot, member in details:
            language = index.files[file].language
            if member is None:
                top = slot[0]
                extra = self._cost_of(top, language, bool(slot[2]) or not slot[3], True) \
                    - self._cost_of(top, language, True, False)
            else:
                extra = self._cost_of(member[0], language, False, True) \
                    - self._cost_of(member[0], language, _first_line(False, language), False)
            if extra > 0 and spent + extra <= budget:
                spent += extra
                if member is None:
                    slot[4] = True
                else:
                    member[2] = True
        by_file: dict[str, list] = {}
        for (file, _line), slot in chosen.items():
            by_file.setdefault(file, []).append(slot)
        for file in by_file:  # files in the order their best snippet was chosen
            for top, score, members, whole, detail, headed in sorted(by_file[file], key=lambda s: s[0].start_line):
                language = index.files[file].language
                members = sorted(members, key=lambda m: m[0].start_line)
                first_line = _first_line(False, language)
                lines = [_render(m, language, header_only=not with_doc and first_line, with_doc=with_doc)
                         for m, _member_score, with_doc in members]
                if headed:
                    # As budgeted: a type that came in for its members, or without room for its fields,
                    # shows its header alone.
                    lines.insert(0, _render(top, language, header_only=not (whole and detail) or bool(members),
                                            with_doc=detail))
                    start, end = top.start_line, top.end_line
                    spans = [(start, end)]
                else:  # methods alone: their receivers name the type
                    spans = [(m[0].start_line, m[0].end_line) for m in members]
                    start, end = spans[0][0], max(span[1] for span in spans)
                picked.append(self._snippet(file, start, end, "definition", round(score, 3), "\n".join(lines), here))
                shown.setdefault(file, []).extend(spans)  # the lines shown, not those between methods
        return spent

    def _linked(self, path: str) -> list[tuple[Link, float]]:
        """The files whose definitions compete for a prompt of `path` (indexed), each with its weight."""
        index = self.index
        language = index.files[path].language
        directory = os.path.dirname(path)
        links = [(link, 1.0) for link in self._resolved(path)]
        seen = {path} | {link.path for link, _weight in links}
        if language == "go":
            # A Go package's files share one namespace: each is as good as an import (test files
            # are another build unit, visible to tests only).
            testing = path.endswith("_test.go")
            for sibling in sorted(index.by_dir.get(directory, ())):
                if sibling not in seen and (testing or not sibling.endswith("_test.go")) \
                        and len(links) < MAX_GO_PACKAGE_FILES:
                    seen.add(sibling)
                    links.append((Link(sibling), 1.0))
        if not links:
            return links
        # What the imported files import in turn (a base class's base, a re-exported name), weighed
        # down: the names near the cursor often belong to a type two imports away.
        for link, _weight in list(links):
            for second in self._resolved(link.path):
                if second.path not in seen and len(links) < MAX_LINKED_FILES:
                    seen.add(second.path)
                    links.append((second, SECOND_HAND_WEIGHT))
        if len(links) < MAX_LINKED_FILES and language != "go":  # the file's own folder, imported or not
            for sibling in sorted(index.by_dir.get(directory, ())):
                outline = index.files.get(sibling)
                if sibling not in seen and outline is not None and outline.language == language \
                        and len(links) < MAX_LINKED_FILES:
                    seen.add(sibling)
                    links.append((Link(sibling), SIBLING_WEIGHT * (TEST_WEIGHT if _is_test(sibling) else 1.0)))
        return links

    def warm(self, path: str, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Make ahead what the first choice for `path` makes once for good: its links and the windows of
        the linked files (up to ~0.3 s for a Go package's first choice), so that choice, on a
        completion's path, finds them (the server runs this in the background when a file opens).
        False when `should_stop` said so between two files (what was made is kept)."""
        index = self.index
        path = os.path.abspath(path)
        if index is None or path not in index.files:
            return True
        texts = {f.path: f.text for f in self.open_files()}
        for link, _weight in self._linked(path):
            outline = index.files.get(link.path)
            if outline is not None:
                if should_stop():
                    return False
                self.file_windows.of(link.path, outline, texts.get(link.path))
        return True

    def _couse(self, path: str, mentioned: set[str], peers: list[str]) -> dict[str, float]:
        """Name -> share (weighted by likeness) of the COUSE_FILES peers most like the file that mention it."""
        if not mentioned:
            return {}
        likeness = []
        for peer in peers:
            names = self._names_of(peer)
            if names:
                shared = len(names & mentioned)
                if shared:
                    likeness.append((shared / math.sqrt(len(names) * len(mentioned)), peer))
        likeness.sort(reverse=True)
        total = sum(weight for weight, _peer in likeness[:COUSE_FILES])
        share: dict[str, float] = {}
        for weight, peer in likeness[:COUSE_FILES]:
            own = self._defined_in(peer)
            for name in self._names_of(peer):
                if name not in own:
                    share[name] = share.get(name, 0.0) + weight / total
        return share

    def _defined_in(self, path: str) -> frozenset[str]:
        outline = self.index.files.get(path)
        entry = self._own.get(path)
        if entry is None or entry[0] is not outline:
            entry = self._own[path] = (outline, frozenset(d.name for d in outline.definitions) if outline else frozenset())
        return entry[1]

    def _names_of(self, path: str) -> frozenset[str]:
        uses = self.index.uses.get(path, ())
        entry = self._use_sets.get(path)
        if entry is None or entry[0] is not uses:
            entry = self._use_sets[path] = (uses, frozenset(uses))
        return entry[1]

    def _weights(self) -> None:
        """Word weights and per-definition totals, remembered for one index generation."""
        if self._weights_generation != self.index.generation:
            self._weights_generation = self.index.generation
            self._idf.clear()
            self._totals.clear()
            if len(self._costs) > MAX_COSTS:
                self._costs.clear()
                self._compact.clear()
            if len(self._use_sets) > 2 * len(self.index.files) + 64:  # files gone from the index
                self._use_sets.clear()
                self._own.clear()

    def _rarity(self, name: str) -> float:
        """How rare a name is among the workspace's files: 0 for a name of two characters (mostly
        keywords) and for one no indexed file mentions (the index counts neither)."""
        if len(name) < 3:
            return 0.0
        return math.log((len(self.index.files) + 1) / (self.index.users(name) + 1)) if self.index.users(name) else 0.0

    def _similarity(self, definition: Definition, near: Counter[str]) -> float:
        """Shared words, rare ones weighing more, over the definition's own word weight (BM25's spirit)."""
        idf = self._idf
        shared = 0.0
        for word in definition.words:
            if word in near:
                weight = idf.get(word)
                if weight is None:
                    weight = idf[word] = self.index.idf(word)
                shared += weight * min(near[word], 3)
        if not shared:
            return 0.0
        total = self._totals.get(id(definition))
        if total is None:
            total = 0.0
            for word in definition.words:
                weight = idf.get(word)
                if weight is None:
                    weight = idf[word] = self.index.idf(word)
                total += weight
            self._totals[id(definition)] = total
        return shared / math.sqrt(total + 1.0)

    def _cost_of(self, definition: Definition, language: str, header_only: bool, with_doc: bool) -> int:
        key = (id(definition), header_only, with_doc)
        entry = self._costs.get(key)
        if entry is None:
            entry = self._costs[key] = (definition, snippet_tokens(_render(definition, language, header_only, with_doc)))
        return entry[1]

    def _resolved(self, path: str) -> list:
        index = self.index
        outline = index.files[path]
        cached = self._links.get(path)
        if cached is not None and cached[0] == index.generation_without(path) and cached[1] is outline:
            return cached[2]
        links = resolve_imports(path, outline, index)
        self._links[path] = (index.generation_without(path), outline, links)
        return links

    def _snippet(self, path: str, start: int, end: int, source: str, score: float, text: str,
                 here: str) -> CrossFileSnippet:
        shown = self.index.relative(path) if self.index is not None else path
        return CrossFileSnippet(path=shown, start_line=start, end_line=end, source=source, score=float(score),
                                tokens=snippet_tokens(text), text=text, shown_path=shown_path(shown, here))

    def _cost(self, text: str, path: str, shown: dict, here: str) -> int:
        return snippet_tokens(text) + (0 if path in shown else self._heading(path, here))

    def _heading(self, path: str, here: str) -> int:
        """Tokens of the heading of the file at `path` in a prompt of the file `here` (workspace path)."""
        return heading_tokens(shown_path(self.index.relative(path) if self.index is not None else path, here))


WINDOW_QUERY_LINES = 20
"""Lines before the cursor's line whose identifiers are matched against open documents' windows."""


def _first_line(top: bool, language: str) -> bool:
    """Whether a definition is first budgeted (and shown, without its details) as its first line alone:
    a top-level one always; a member too, except in Python, whose members' further signature lines
    (parameters wrapped) measured better shown than traded for more definitions."""
    return top or language != "python"


def _receiver_names_type(language: str) -> bool:
    """Whether a method's own signature names its type (Go's receiver, `func (c *Client) Do(...)`):
    then a method is shown without its type's header, which would say nothing more."""
    return language == "go"


def _render(definition: Definition, language: str, header_only: bool = False, with_doc: bool = True) -> str:
    """The definition as the prompt shows it: its signature (or header), with its doc line if asked."""
    signature = definition.signature
    if header_only:
        signature = signature.split("\n")[0].rstrip()
    doc = definition.doc if with_doc else ""
    if not doc:
        return signature
    indent = signature[: len(signature) - len(signature.lstrip())]
    if language == "python":
        return f'{signature.removesuffix(" ...")}\n{indent}    """{doc}"""'
    return f"{indent}{'--' if language == 'lua' else '//'} {doc}\n{signature}"


_ENCLOSING = {
    "go": re.compile(r"^func\s*(?:\(\s*\w*\s*\*?\s*(\w+)[^)]*\))?", re.M),
    "python": re.compile(r"^(?:class\s+(\w+)\s*(?:\(([^)]*)\))?|(?:async\s+)?def\s)", re.M),
    "javascript": re.compile(r"^(?:export\s+)?(?:default\s+)?(?:abstract\s+)?(?:class\s+(\w+)(?:[^\n{]*?\bextends\s+([\w.]+))?|function\s|const\s|let\s)", re.M),
}
_ENCLOSING["typescript"] = _ENCLOSING["tsx"] = _ENCLOSING["javascript"]
_BASES = re.compile(r"(?:class\s+\w+\s*\(([^)]*)\)|extends\s+([\w.]+))")


def _enclosing_types(before: str, language: str, outlines: list) -> set[str]:
    """The type whose member the code before the cursor is in, with its bases found among `outlines`."""
    pattern = _ENCLOSING.get(language)
    if pattern is None:
        return set()
    matches = list(pattern.finditer(before))
    last = matches[-1] if matches else None
    if last is None or not last.group(1):
        return set()
    found = {last.group(1)}
    bases = [b for b in (last.groups()[1:] if last.lastindex and last.lastindex > 1 else ()) if b]
    names = [part.strip().split(".")[-1] for group in bases for part in group.split(",")]
    classes = None
    while names and len(found) < 8:
        name = names.pop()
        if not name or name in found or not name.isidentifier():
            continue
        found.add(name)
        if classes is None:
            classes = {d.name: d for outline in outlines for d in outline.definitions
                       if d.parent is None and d.kind in ("class", "type")}
        definition = classes.get(name)
        match = _BASES.search(definition.signature.split("\n")[0]) if definition is not None else None
        if match:
            names.extend(part.strip().split(".")[-1] for part in (match.group(1) or match.group(2)).split(","))
    return found


_QUALIFIED = re.compile(r"([A-Za-z_$][\w$]*)[ \t]*\.[ \t]*[A-Za-z_$]")


def _qualifiers(before: str, after: str) -> Counter[str]:
    """How often each name qualifies another (`events.` in `events.get_running_loop()`) in the lines
    around the cursor's line (not in it)."""
    lines = before.split("\n")[-WORD_LINES_BEFORE - 1:] + after.split("\n")[:WORD_LINES_AFTER]
    return Counter(_QUALIFIED.findall("\n".join(lines)))


def _alias_uses(link: Link, qualifiers: Counter[str]) -> int:
    """Uses near the cursor of the name a whole-module import binds (its alias, or the module's own
    name: `errors.` of `import email.errors`)."""
    if link.names or link.same_package or not qualifiers:
        return 0
    stem = os.path.splitext(os.path.basename(link.path))[0]
    if link.path.endswith(".go"):  # a Go package's name is its alias, not a file's
        stem = link.alias or ""
    elif stem in ("__init__", "index", "mod"):
        stem = os.path.basename(os.path.dirname(link.path))
    uses = qualifiers.get(stem, 0)
    if link.alias and link.alias != stem:
        uses += qualifiers.get(link.alias, 0)
    return uses


def _is_test(path: str) -> bool:
    name = os.path.basename(path)
    return name.startswith("test_") or name.endswith(("_test.go", "_test.py")) or ".test." in name \
        or ".spec." in name or f"{os.sep}tests{os.sep}" in path


def _closeness(anchors: list[int], line: int) -> float:
    """1 at an anchor line, falling linearly to 0 LOCALITY_LINES away from the nearest one."""
    at = bisect.bisect_left(anchors, line)
    nearest = min(abs(anchors[i] - line) for i in (at - 1, at) if 0 <= i < len(anchors))
    return max(0.0, 1.0 - nearest / LOCALITY_LINES)


_CONSTRUCTORS = frozenset({"constructor", "new", "init"})


def _twin_key(definition: Definition) -> tuple[str, str | None]:
    """What two definitions share when one of them says what the other would: the name, and for a
    constructor (which makes its own type) the type too."""
    name = definition.name
    own_type = name in _CONSTRUCTORS or (name.startswith("__") and name.endswith("__"))
    return name, definition.parent if own_type else None


def shown_path(path: str, here: str) -> str:
    """How a prompt of the file at workspace path `here` names the file at workspace path `path`:
    relative to `here`'s folder when inside it (`client.go`, `parse/node.go`), else `path` itself.
    The folder is the same for all of a package's files (in Go always): said once per file it took
    a fifth of Go's cross-file budget."""
    folder = here.rpartition("/")[0]
    return path[len(folder) + 1:] if folder and path.startswith(folder + "/") else path


def heading_tokens(shown_path: str) -> int:
    """Tokens of a file's heading in the prompt (`// From path:`, then a newline)."""
    return approx_token_count(f"// From {shown_path}:") + 1


def snippet_tokens(text: str) -> int:
    """Tokens of `text` as the prompt shows it: each line behind a comment mark (`# `, `// `), then a newline."""
    return approx_token_count(text) + text.count("\n") + 2


def _overlaps(shown: dict, path: str, start: int, end: int) -> bool:
    return any(start < e and s < end for s, e in shown.get(path, ()))
