"""The built-in tiny models: `tiny-random` is built locally, deterministically, and cached; `tiny` is
the model trained on a CPU, shipped inside the package and loaded as it lies."""

import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import torch

from dgemma_lsp.engine.errors import ModelNotFoundError
from dgemma_lsp.engine.model import tiny_model
from dgemma_lsp.engine.runtime.service import InfillService
from dgemma_lsp.engine.training import ship
from dgemma_lsp.engine.weights import loading
from tests.training.conftest import MICRO

REPO = Path(__file__).resolve().parents[2]
SHIPPED_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja", "corpus.json", "training.json"}


def test_two_builds_are_identical_and_the_second_start_reuses_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "a"))
    first = tiny_model.ensure_tiny_random_model()
    assert first.is_relative_to(tmp_path / "a")
    built_at = (first / "model.safetensors").stat().st_mtime_ns
    assert tiny_model.ensure_tiny_random_model() == first
    assert (first / "model.safetensors").stat().st_mtime_ns == built_at

    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "b"))
    second = tiny_model.ensure_tiny_random_model()
    assert (first / "tokenizer.json").read_text() == (second / "tokenizer.json").read_text()
    from safetensors.torch import load_file

    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def test_the_tokenizer_pins_gemma_special_ids():
    tokenizer = tiny_model.build_tiny_tokenizer()
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    assert len(tokenizer) <= 1021  # below the image/boi/eoi ids of the tiny config


def test_tiny_loads_the_trained_weights_from_the_package_with_no_build_step(tmp_path, monkeypatch):
    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "cache"))
    folder = loading.resolve_model_folder("tiny")
    assert folder == tiny_model.shipped_tiny_dir() and folder.is_relative_to(REPO / "engine")
    model, tokenizer, device = loading.load_model_and_tokenizer("tiny")
    assert not (tmp_path / "cache").exists()  # nothing built, nothing cached
    assert device == "cpu" and model.config.text_config.vocab_size > len(tiny_model.build_tiny_tokenizer())
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                         add_generation_prompt=True).endswith("<|turn>model\n")


def test_the_shipped_model_names_every_source_its_licence_and_its_cost():
    folder = tiny_model.shipped_tiny_dir()
    assert {path.name for path in folder.iterdir()} == SHIPPED_FILES
    assert sum(path.stat().st_size for path in folder.iterdir()) <= ship.MAX_SHIPPED_BYTES
    corpus = json.loads((folder / "corpus.json").read_text())
    assert len(corpus["sources"]) > 10
    assert all(source["licence"].strip() and source["name"] for source in corpus["sources"])
    record = json.loads((folder / "training.json").read_text())
    assert record["cpuSeconds"] > 3600 and record["tokens"] > 10**6 and record["answerTokens"] > 10**5
    # Suffix-first unless a request names a layout (ship.PROMPT_LAYOUT says why).
    assert json.loads((folder / "tokenizer_config.json").read_text())["dgemma_prompt_layout"] == "suffix-first"
    # The longest context it was trained on: the server cuts every request's context to it.
    trained = record["recipe"]["data"]["contextTokens"]
    assert json.loads((folder / "tokenizer_config.json").read_text())["dgemma_context_tokens"] == max(trained)
    held_out = set(record["recipe"]["data"]["heldOutSources"])
    assert held_out and not held_out & {source["name"] for source in corpus["sources"]}
    if record["recipe"]["data"].get("focusShare"):  # the focus packages (training/focus.py) are listed too
        focus = corpus["focus"]
        assert focus["sources"] and all(source["licence"].strip() and source["tokens"] for source in focus["sources"])
        assert not {name.split("==")[0] for name in focus["heldOut"]} & {source["name"] for source in focus["sources"]}


def test_a_missing_shipped_model_is_a_one_line_error_naming_the_way_out(monkeypatch, tmp_path):
    monkeypatch.setattr(tiny_model, "shipped_tiny_dir", lambda: tmp_path / "tiny")
    with pytest.raises(ModelNotFoundError, match="--model tiny-random"):
        loading.resolve_model_folder("tiny")


def test_tiny_denoises_through_the_command_line_and_answers_only_printable_text():
    """The shipped model loads and denoises from the command line; what it answers (blank candidates are
    dropped, so possibly nothing: the model's wording is not this test's verdict) is printable text."""
    done = subprocess.run(
        [sys.executable, "-m", "dgemma_lsp.server.cli", "complete", f"{REPO / 'examples' / 'fib.py'}:8:12",
         "--model", "tiny", "--seed", "1", "--candidates", "3", "--json"],  # 3: what the server asks by default
        capture_output=True, text=True, timeout=300, check=True,
    )
    report = json.loads(done.stdout)
    assert (report["model"], report["device"], report["plan"]["kind"]) == ("tiny", "cpu", "line")
    assert report["promptTokens"] > 0 and report["steps"] >= 1 and report["drafts"] >= 1 and report["canvases"] >= 1
    assert len(report["candidates"]) <= 3
    for candidate in report["candidates"]:
        assert candidate["text"].strip()
        assert not [ch for ch in candidate["text"] if unicodedata.category(ch) == "Cc" and ch not in "\t\n"]


def test_ship_replaces_the_model_folder_with_a_snapshot_and_refuses_an_oversized_one(tmp_path, monkeypatch):
    run = tmp_path / "run"  # a real run of the micro recipe, two steps: what `ship` takes from any run
    recipe = tmp_path / "micro.json"
    recipe.write_text(json.dumps(MICRO))
    done = subprocess.run([sys.executable, "-m", "dgemma_lsp.server.cli", "train", str(run), "--config", str(recipe),
                           "--steps", "2", "--threads", "1", "--quiet"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    target = tmp_path / "tiny"
    record = ship.ship(run, ship.snapshot_path(run, "checkpoint.pt"), target)
    state = torch.load(run / "checkpoint.pt", weights_only=False, map_location="cpu")
    assert record["steps"] == state["step"] and record["cpuSeconds"] == state["cpuSeconds"]
    assert {path.name for path in target.iterdir()} == SHIPPED_FILES
    service = InfillService(str(target))
    service.load()
    assert service.status().context_tokens == max(json.loads((run / "recipe.json").read_text())["data"]["contextTokens"])
    model, _, _ = loading.load_model_and_tokenizer(str(target))
    loaded = model.state_dict()["model.decoder.embed_tokens.weight"]
    assert torch.equal(loaded, state["model"]["model.decoder.embed_tokens.weight"].to(torch.bfloat16).float())  # bf16 shipped

    before = (target / "training.json").read_text()
    monkeypatch.setattr(ship, "MAX_SHIPPED_BYTES", 1024)
    with pytest.raises(ValueError, match="over the"):
        ship.ship(run, ship.snapshot_path(run, "checkpoint.pt"), target)
    assert (target / "training.json").read_text() == before and not (tmp_path / "tiny.new").exists()
