"""`dgemma-lsp bench nextedit`: does the proposed next edit equal the one the authors made next?

Real edit pairs: two released versions of the same packages, fetched by name with pip
(`pip download NAME==A --no-deps --only-binary :all:`, wheels are zip files of the sources),
diffed file by file (Python files present in both) into hunks of whole lines. Two hunks of
one file are *related* when they touch a common identifier (one that appears on one side of
a hunk and not the other: a renamed name, a new argument) and lie within `--max-gap` lines.

- related case: the file after the first hunk of a related pair (that hunk is the user's edit,
  logged as one edit; the cursor at its end); right is a proposal that turns the file into the
  file after the second hunk as well (exact match), and chrF (character n-grams 1-6, beta 2,
  whitespace removed, as sacrebleu's chrF) between the changed text proposed and the changed
  text of the second hunk (the removed text, then the inserted text; "no edit" scores 0);
- unrelated case: the file after a hunk that no other hunk of its file relates to; right is
  "no edit".

Rows: the model (the server's own pipeline: prepare_next_edit, InfillService.denoise,
finish_next_edit, the revert filter) and the *oracle*, the true next edit in the model's place
(the window with the second hunk applied when it lies inside the window, else the window
unchanged): what the pipeline (window choice, diffing, hunk picking, filters) keeps of a
perfect model. chrF is our own 20 lines: sacrebleu would add five packages for one formula.
Knows the engine's pipeline; not LSP.
"""

from __future__ import annotations

import difflib
import keyword
import re
import statistics
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import msgspec

from .report import say, write_report

DEFAULT_PACKAGES = (
    "attrs==23.1.0..23.2.0",
    "click==8.1.3..8.1.7",
    "requests==2.31.0..2.32.3",
    "packaging==23.2..24.0",
    "jinja2==3.1.2..3.1.4",
)
CACHE = Path("artifacts") / "nextedit-packages"
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_HUNK_LINES = 12
"""Hunks longer than this on either side are not edits one proposes: skipped."""


@dataclass(frozen=True)
class Hunk:
    """Lines old[i1:i2] became new[j1:j2]."""

    i1: int
    i2: int
    j1: int
    j2: int
    touched: frozenset[str]


@dataclass(frozen=True)
class Case:
    package: str
    path: str
    before: str
    """The file after the user's edit (the first hunk)."""
    user_start: int
    user_end: int
    user_before: str
    """The user's edit: text[user_start:user_end] replaced `user_before`."""
    expected: str | None
    """The file after the true next edit; None: the right answer is no edit."""


class Row(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    name: str
    related: int
    exact: float
    """Share of related cases whose proposal equals the true next edit."""
    chrf: float
    """Mean chrF (0-100) of the changed text over related cases."""
    proposed_related: float
    """Share of related cases with any proposal."""
    unrelated: int
    no_edit: float
    """Share of unrelated cases answered with no edit (right)."""
    in_window: float | None = None
    """Oracle only: share of related cases whose true next edit lies inside the window."""


class NextEditReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    model: str
    packages: list[str]
    strength: float
    steps: int | None
    context_tokens: int
    seeds: int
    rows: list[Row]


# -- data -------------------------------------------------------------------------------------


def fetch(spec: str, cache: Path) -> dict[str, str]:
    """The Python files of one released wheel (NAME==VERSION), by path inside the wheel."""
    name, _, version = spec.partition("==")
    folder = cache / f"{name}-{version}"
    wheels = list(folder.glob("*.whl")) if folder.exists() else []
    if not wheels:
        folder.mkdir(parents=True, exist_ok=True)
        say(f"nextedit: pip download {spec}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
                        "-d", str(folder), spec], check=True, stdout=subprocess.DEVNULL)
        wheels = list(folder.glob("*.whl"))
    files = {}
    with zipfile.ZipFile(wheels[0]) as wheel:
        for info in wheel.infolist():
            if info.filename.endswith(".py"):
                files[info.filename] = wheel.read(info).decode("utf-8", "replace")
    return files


def touched(old: list[str], new: list[str]) -> frozenset[str]:
    """Identifiers on one side of a hunk and not the other (keywords aside)."""
    before = set(IDENTIFIER.findall("".join(old)))
    after = set(IDENTIFIER.findall("".join(new)))
    return frozenset(name for name in before ^ after if not keyword.iskeyword(name) and len(name) > 1)


def hunks_of(old: list[str], new: list[str]) -> list[Hunk]:
    found = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag != "equal" and i2 - i1 <= MAX_HUNK_LINES and j2 - j1 <= MAX_HUNK_LINES:
            found.append(Hunk(i1, i2, j1, j2, touched(old[i1:i2], new[j1:j2])))
    return found


def cases_of(package: str, path: str, old_text: str, new_text: str, max_gap: int) -> tuple[list[Case], list[Case]]:
    """(related cases, unrelated cases) of one file."""
    old = old_text.splitlines(keepends=True)
    new = new_text.splitlines(keepends=True)
    hunks = hunks_of(old, new)
    related, unrelated = [], []
    for a in hunks:
        if not a.touched:
            continue
        partners = [b for b in hunks if b is not a and a.touched & b.touched and abs(b.i1 - a.i1) <= max_gap]
        after_a = old[: a.i1] + new[a.j1:a.j2] + old[a.i2:]
        start = sum(len(line) for line in old[: a.i1])
        end = start + sum(len(line) for line in new[a.j1:a.j2])
        user_before = "".join(old[a.i1:a.i2])
        before = "".join(after_a)
        if not any(a.touched & b.touched for b in hunks if b is not a):
            unrelated.append(Case(package, path, before, start, end, user_before, None))
            continue
        if not partners:
            continue
        b = min(partners, key=lambda h: abs(h.i1 - a.i1))
        shift = (a.j2 - a.j1) - (a.i2 - a.i1) if b.i1 > a.i1 else 0
        lines = list(after_a)
        lines[b.i1 + shift: b.i2 + shift] = new[b.j1:b.j2]
        related.append(Case(package, path, before, start, end, user_before, "".join(lines)))
    return related, unrelated


def all_cases(packages: list[str], cache: Path, max_gap: int) -> tuple[list[Case], list[Case]]:
    related, unrelated = [], []
    for spec in packages:
        name, _, versions = spec.partition("==")
        first, _, second = versions.partition("..")
        old_files = fetch(f"{name}=={first}", cache)
        new_files = fetch(f"{name}=={second}", cache)
        for path in sorted(old_files.keys() & new_files.keys()):
            if old_files[path] != new_files[path]:
                r, u = cases_of(name, path, old_files[path], new_files[path], max_gap)
                related += r
                unrelated += u
    return related, unrelated


# -- scoring ----------------------------------------------------------------------------------


def chrf(hypothesis: str, reference: str, order: int = 6, beta: float = 2.0) -> float:
    """chrF in 0-100, whitespace removed (sacrebleu's defaults, character n-grams only)."""
    hyp, ref = "".join(hypothesis.split()), "".join(reference.split())
    if not hyp or not ref:
        return 100.0 if hyp == ref else 0.0
    precisions, recalls = [], []
    for n in range(1, order + 1):
        h = _ngrams(hyp, n)
        r = _ngrams(ref, n)
        if not h or not r:
            continue
        common = sum(min(count, r.get(gram, 0)) for gram, count in h.items())
        precisions.append(common / sum(h.values()))
        recalls.append(common / sum(r.values()))
    if not precisions:
        return 0.0
    p, r = statistics.mean(precisions), statistics.mean(recalls)
    return 0.0 if p + r == 0 else 100 * (1 + beta**2) * p * r / (beta**2 * p + r)


def _ngrams(text: str, n: int) -> dict[str, int]:
    grams: dict[str, int] = {}
    for i in range(len(text) - n + 1):
        grams[text[i:i + n]] = grams.get(text[i:i + n], 0) + 1
    return grams


def changed_text(before: str, after: str) -> str:
    """What an edit from `before` to `after` removes, then what it inserts ("" when they are equal)."""
    head = 0
    while head < min(len(before), len(after)) and before[head] == after[head]:
        head += 1
    tail = 0
    while tail < min(len(before), len(after)) - head and before[-1 - tail] == after[-1 - tail]:
        tail += 1
    return before[head: len(before) - tail] + "\n" + after[head: len(after) - tail]


# -- running ----------------------------------------------------------------------------------


def prepare(case: Case, strength: float, settings, max_lines: int, budget_tokens: int = 2048):
    from dgemma_lsp.engine.nextedit.edits import EditLog, RecentEdit
    from dgemma_lsp.engine.nextedit.request import prepare_next_edit
    from dgemma_lsp.engine.syntax.document import SyntaxDocument

    log = EditLog()
    log.edits = [RecentEdit(case.user_start, case.user_end, case.user_before)]
    doc = SyntaxDocument(case.before, "python")
    return log, prepare_next_edit(doc, case.user_end, log, strength, settings, path=case.path, max_lines=max_lines,
                                  budget_tokens=budget_tokens)


def propose(case: Case, prepared, log, answer: str) -> str:
    """The file after the proposal made from `answer` (the file unchanged for no edit)."""
    from dgemma_lsp.engine.nextedit.proposal import reverts_last_edit
    from dgemma_lsp.engine.nextedit.request import finish_next_edit

    edit = finish_next_edit(prepared, case.before, answer)
    if edit is None or reverts_last_edit(case.before, edit, log.last):
        return case.before
    return edit.apply(case.before)


def oracle_answer(case: Case, prepared) -> tuple[str, bool]:
    """(the window as a perfect model writes it, whether the true next edit lies inside it)."""
    window = prepared.window
    if case.expected is None:
        return case.before[window.start:window.end], True
    tail = len(case.before) - window.end
    inside = case.expected[:window.start] == case.before[:window.start] and (
        tail == 0 or case.expected[-tail:] == case.before[-tail:])
    if not inside:
        return case.before[window.start:window.end], False
    return case.expected[window.start: len(case.expected) - tail], True


def score(name: str, related: list[Case], related_after: list[str], unrelated: list[Case],
          unrelated_after: list[str], in_window: float | None = None) -> Row:
    exact = [after == case.expected for case, after in zip(related, related_after, strict=True)]
    chrfs = [chrf(changed_text(case.before, after) if after != case.before else "",
                  changed_text(case.before, case.expected)) for case, after in zip(related, related_after, strict=True)]
    proposed = [after != case.before for case, after in zip(related, related_after, strict=True)]
    no_edit = [after == case.before for case, after in zip(unrelated, unrelated_after, strict=True)]
    return Row(name=name, related=len(related), exact=round(_share(exact), 3),
               chrf=round(statistics.mean(chrfs), 1) if chrfs else 0.0, proposed_related=round(_share(proposed), 3),
               unrelated=len(unrelated), no_edit=round(_share(no_edit), 3),
               in_window=None if in_window is None else round(in_window, 3))


def _spread(cases: list[Case], limit: int) -> list[Case]:
    """At most `limit` cases, evenly spaced over the list (every package, not the first ones only)."""
    if len(cases) <= limit:
        return cases
    return [cases[index * len(cases) // limit] for index in range(limit)]


def _share(values: list[bool]) -> float:
    return sum(values) / len(values) if values else 0.0


def run_benchmark(model: str, *, packages: list[str], cache: Path, strength: float, steps: int | None, seeds: int,
                  limit: int, max_gap: int, max_lines: int, oracle_only: bool, context_tokens: int = 2048,
                  threads: int | None = None, device=None, dtype=None, log=None) -> NextEditReport:
    from dgemma_lsp.engine.api import GenerationSettings

    related, unrelated = all_cases(packages, cache, max_gap)
    related, unrelated = _spread(related, limit), _spread(unrelated, limit)
    if log:
        log(f"nextedit: {len(related)} related and {len(unrelated)} unrelated cases from {len(packages)} packages")
    settings = GenerationSettings(steps=steps, seed=0)
    prepared_related = [prepare(case, strength, settings, max_lines, context_tokens) for case in related]
    prepared_unrelated = [prepare(case, strength, settings, max_lines, context_tokens) for case in unrelated]
    rows = []
    answers = [oracle_answer(case, p) for case, (_, p) in zip(related, prepared_related, strict=True)]
    rows.append(score(
        "oracle", related, [propose(c, p, lg, a) for c, (lg, p), (a, _) in zip(related, prepared_related, answers,
                                                                                 strict=True)],
        unrelated, [propose(c, p, lg, oracle_answer(c, p)[0]) for c, (lg, p) in zip(unrelated, prepared_unrelated,
                                                                                     strict=True)],
        in_window=_share([inside for _, inside in answers]),
    ))
    if not oracle_only:
        import msgspec as _msgspec

        from dgemma_lsp.engine.runtime.service import InfillService

        service = InfillService(model, device=device, dtype=dtype, cpu_threads=threads)
        service.load()

        def run_model(cases, prepared_cases, seed):
            afters = []
            for index, (case, (lg, p)) in enumerate(zip(cases, prepared_cases, strict=True)):
                request = _msgspec.structs.replace(
                    p.request, settings=_msgspec.structs.replace(p.request.settings, seed=seed))
                answer = service.denoise(request).candidates[0].text
                afters.append(propose(case, p, lg, answer))
                if log and index % 20 == 19:
                    log(f"nextedit: seed {seed}: {index + 1}/{len(cases)}")
            return afters

        for seed in range(seeds):
            rows.append(score(f"{model} seed {seed}", related, run_model(related, prepared_related, seed),
                              unrelated, run_model(unrelated, prepared_unrelated, seed)))
    return NextEditReport(model=model, packages=packages, strength=strength, steps=steps,
                          context_tokens=context_tokens, seeds=seeds, rows=rows)


def format_table(report: NextEditReport) -> str:
    lines = [f"next edit ({', '.join(report.packages)}; strength {report.strength}, steps {report.steps or 'default'}, "
             f"context {report.context_tokens} tokens)",
             f"{'row':<22}{'related':>8}{'exact':>8}{'chrF':>7}{'proposed':>10}{'unrelated':>10}{'no edit':>9}"
             f"{'in window':>11}"]
    for row in report.rows:
        window = "" if row.in_window is None else f"{row.in_window:.1%}"
        lines.append(f"{row.name:<22}{row.related:>8}{row.exact:>8.1%}{row.chrf:>7.1f}{row.proposed_related:>10.1%}"
                     f"{row.unrelated:>10}{row.no_edit:>9.1%}{window:>11}")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--package", action="append",
                        help=f"NAME==OLD..NEW (repeatable); default {', '.join(DEFAULT_PACKAGES)}")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where downloaded wheels are kept")
    parser.add_argument("--strength", type=float, default=0.4, help="the next edit's renoising strength")
    parser.add_argument("--steps", type=int, default=8, help="full-schedule steps per canvas")
    parser.add_argument("--seeds", type=int, default=1, help="model rows, one per seed")
    parser.add_argument("--limit", type=int, default=100, help="at most this many cases of each kind")
    parser.add_argument("--max-gap", type=int, default=40, help="lines between two hunks of a related pair")
    parser.add_argument("--max-lines", type=int, default=30, help="longest edit window, in lines")
    parser.add_argument("--context-tokens", type=int, default=2048, help="prompt budget around the window")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--oracle-only", action="store_true", help="skip the model (no torch needed)")


def run(args) -> int:
    report = run_benchmark(
        getattr(args, "model", None) or "tiny", packages=args.package or list(DEFAULT_PACKAGES), cache=args.cache,
        strength=args.strength, steps=args.steps, seeds=args.seeds, limit=args.limit, max_gap=args.max_gap,
        max_lines=args.max_lines, oracle_only=args.oracle_only, context_tokens=args.context_tokens,
        threads=args.threads, device=getattr(args, "device", None),
        dtype=getattr(args, "dtype", None), log=say,
    )
    write_report(report, getattr(args, "json", False), format_table)
    return 0
