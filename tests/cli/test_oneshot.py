"""`dgemma-lsp complete` / `rewrite` as a user runs them: a real subprocess, the tiny model."""

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = "import math\n\n\ndef area(radius):\n    return \n\n\nprint(area(2.0))\n"


def dgemma(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dgemma_lsp.server.cli", *args, *([] if "--model" in args else ["--model", "tiny-random"])],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "circle.py"
    path.write_text(EXAMPLE)
    return path


def test_complete_json_reports_plan_candidates_steps_and_timings(source):
    done = dgemma("complete", f"{source}:5:12", "--model", "tiny-random", "--steps", "4", "--seed", "1",
                  "--candidates", "2", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["plan"]) == {"kind", "region", "stop", "contextTokens"}
    assert report["steps"] == report["drafts"] == 4
    assert report["tokensPerForward"] > 0
    assert set(report["timingsMs"]) == {"load", "prompt", "denoise", "total"}
    for candidate in report["candidates"]:
        assert {"text", "confidence", "syntaxOk"} <= set(candidate)


def test_plain_output_is_the_infill_only_and_deterministic_by_seed(source):
    first = dgemma("complete", f"{source}:5:12", "--steps", "3", "--seed", "7")
    again = dgemma("complete", f"{source}:5:12", "--steps", "3", "--seed", "7")
    assert first.returncode == again.returncode == 0
    assert first.stdout == again.stdout
    assert "{" not in first.stdout.splitlines()[0] or not first.stdout.startswith("{\n")


SELECTION = "return \n\n\nprint(area(2.0))"


def test_rewrite_reports_the_exact_selection(source):
    start = EXAMPLE.index(SELECTION)
    done = dgemma("rewrite", f"{source}:5:5-8:17", "--steps", "4", "--seed", "1", "--strength", "0.1", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["selection"] == {"start": start, "end": start + len(SELECTION), "text": SELECTION}
    # The candidate rewrites that selection: at strength 0.1 its kept tokens are pinned, so even the
    # random tiny model gives most of it back (an infill, or a rewrite of other text, would not).
    (candidate,) = report["candidates"]
    kept = difflib.SequenceMatcher(None, SELECTION, candidate["text"], autojunk=False)
    assert sum(block.size for block in kept.get_matching_blocks()) >= 0.7 * len(SELECTION), candidate["text"]
    assert report["canvases"] == 1 and report["steps"] == 1  # ceil(0.1 * 4): the tail of the schedule


@pytest.mark.parametrize(("text", "where"), [("", "1:1"), ("\n\n  \n", "2:1"), ("\n\n  \n", "3:3"), ("total = 1", "1:10")],
                         ids=["empty", "blank lines", "end of blank lines", "no final line break"])
def test_a_new_file_is_completed_without_an_error(tmp_path, text, where):
    path = tmp_path / "new.py"
    path.write_text(text)
    done = dgemma("complete", f"{path}:{where}", "--steps", "2", "--max-tokens", "8", "--seed", "1", "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert isinstance(json.loads(done.stdout)["candidates"], list)


def test_a_10mb_file_is_cut_to_the_context_budget_and_answered(tmp_path):
    big = tmp_path / "big.py"
    lines = [f"value_{i} = {i}\n" for i in range(700_000)]
    big.write_text("".join(lines))
    assert big.stat().st_size > 10_000_000
    done = dgemma("complete", f"{big}:350000:1", "--steps", "2", "--seed", "1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["plan"]["contextTokens"] <= 2048


def _bad_inputs(tmp_path: Path, source: Path):
    corrupt = tmp_path / "corrupt-model"
    corrupt.mkdir()
    (corrupt / "config.json").write_text("{not json")
    binary = tmp_path / "latin1.py"
    binary.write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    return {
        "missing file": ["complete", f"{tmp_path}/nope.py:1:1"],
        "line outside": ["complete", f"{source}:99:1"],
        "column outside": ["complete", f"{source}:1:99"],
        "no position": ["complete", str(source)],
        "unknown model id": ["complete", f"{source}:1:1", "--model", "nobody/no-such-model"],
        "corrupt model folder": ["complete", f"{source}:1:1", "--model", str(corrupt)],
        "non-UTF-8 file": ["complete", f"{binary}:1:1"],
        "empty selection": ["rewrite", f"{source}:2:1-2:1"],
        "bad strength": ["rewrite", f"{source}:1:1-1:5", "--strength", "1.5"],
    }


def test_bad_input_is_one_clear_line_and_a_nonzero_exit(tmp_path, source):
    for name, args in _bad_inputs(tmp_path, source).items():
        done = dgemma(*args)
        assert done.returncode == 2, (name, done.stderr)
        assert "Traceback" not in done.stderr, name
        lines = [line for line in done.stderr.splitlines() if line.startswith("dgemma-lsp:")]
        assert len(lines) == 1, (name, done.stderr)
        assert done.stdout == "", name


def test_cpu_threads_must_be_a_whole_number_of_at_least_one():
    for bad in ("0", "x", "-2"):
        result = subprocess.run(
            [sys.executable, "-m", "dgemma_lsp.server.cli", "--cpu-threads", bad, "--stdio"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
        )
        assert result.returncode == 2 and result.stdout == ""  # stdout is the protocol's
        assert "--cpu-threads" in result.stderr and repr(bad) in result.stderr


def test_complete_json_lists_the_cross_file_snippets_and_no_cross_file_drops_them(tmp_path):
    (tmp_path / ".git").mkdir()  # the workspace root `complete` looks for
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "models.py").write_text(
        'class Invoice:\n    """A bill."""\n\n    def total_with_tax(self, rate):\n        return rate\n')
    report_py = tmp_path / "app" / "report.py"
    report_py.write_text("from .models import Invoice\n\n\ndef summary(invoice: Invoice):\n    return invoice.\n")
    position = f"{report_py}:5:20"
    done = dgemma("complete", position, "--steps", "2", "--max-tokens", "8", "--seed", "1", "--json")
    assert done.returncode == 0, done.stderr
    (snippet,) = json.loads(done.stdout)["crossFile"]
    assert snippet["path"] == "app/models.py" and snippet["source"] == "definition"
    assert snippet["lines"] == [1, 5] and snippet["tokens"] > 0 and snippet["score"] > 0
    off = dgemma("complete", position, "--steps", "2", "--max-tokens", "8", "--seed", "1", "--json", "--no-cross-file")
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout)["crossFile"] == []


def test_a_model_that_names_its_context_gets_no_more_of_the_file_than_that(tmp_path):
    """`dgemma_context_tokens` in a model folder's tokenizer_config.json cuts every request's context to it
    (a model trained on short contexts writes noise past them); a folder without it gets the full budget.
    The value is read by the engine, so the status says it too; a value that is not a count is ignored."""
    import shutil

    from dgemma_lsp.engine.model.tiny_model import ensure_tiny_random_model
    from dgemma_lsp.engine.runtime.service import InfillService

    long_file = tmp_path / "long.py"
    long_file.write_text("".join(f"def f_{i}(x):\n    return x + {i}\n\n\n" for i in range(400)))
    folder = tmp_path / "model"
    shutil.copytree(ensure_tiny_random_model(), folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())

    def context_tokens() -> int:
        done = dgemma("complete", f"{long_file}:802:12", "--model", str(folder), "--steps", "2", "--seed", "1",
                      "--cross-file-tokens", "0", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["plan"]["contextTokens"]

    assert context_tokens() > 1000
    config_path.write_text(json.dumps({**config, "dgemma_context_tokens": 120}))
    assert 60 < context_tokens() <= 120
    service = InfillService(str(folder))
    service.load()
    assert service.status().context_tokens == 120
    config_path.write_text(json.dumps({**config, "dgemma_context_tokens": "short"}))
    service = InfillService(str(folder))
    service.load()
    assert service.status().context_tokens is None
