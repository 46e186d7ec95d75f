"""The built-in tiny model is built locally, deterministically, and cached."""

import torch

from dgemma_lsp.engine.runtime import tiny_model


def test_two_builds_are_identical_and_the_second_start_reuses_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "a"))
    first = tiny_model.ensure_tiny_model()
    assert first.is_relative_to(tmp_path / "a")
    built_at = (first / "model.safetensors").stat().st_mtime_ns
    assert tiny_model.ensure_tiny_model() == first
    assert (first / "model.safetensors").stat().st_mtime_ns == built_at

    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path / "b"))
    second = tiny_model.ensure_tiny_model()
    assert (first / "tokenizer.json").read_text() == (second / "tokenizer.json").read_text()
    from safetensors.torch import load_file

    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def test_the_tokenizer_pins_gemma_special_ids():
    tokenizer = tiny_model.build_tiny_tokenizer()
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    assert len(tokenizer) <= 1021  # below the image/boi/eoi ids of the tiny config
