"""`--quantization` at load time: quantize once, save, and load the packed weights on later starts."""

import pytest

from dgemma_lsp.engine.api import DenoiseRequest, GenerationSettings, InfillContext
from dgemma_lsp.engine.model.folders import resolve_model_folder
from dgemma_lsp.engine.runtime.denoising import DenoisingRuntime
from dgemma_lsp.engine.weights.loading import quantized_cache_dir

REQUEST = DenoiseRequest(
    context=InfillContext(prefix="def f(x):\n    return ", suffix="\n", language="python"),
    settings=GenerationSettings(steps=4, seed=3),
)


@pytest.mark.parametrize("mode", ["int8", "int4", "fp8"])
def test_second_start_loads_the_saved_quantized_weights_and_answers_the_same(mode, tmp_path, monkeypatch):
    monkeypatch.setenv("DGEMMA_LSP_CACHE", str(tmp_path))
    saved = quantized_cache_dir(resolve_model_folder("tiny-random"), mode)
    assert not saved.exists()

    first = DenoisingRuntime.load("tiny-random", quantization=mode)
    assert (saved / "quantization.json").is_file()
    second = DenoisingRuntime.load("tiny-random", quantization=mode)
    plain = DenoisingRuntime.load("tiny-random")

    assert second.memory_bytes < plain.memory_bytes
    answer = first.run(REQUEST)
    assert answer.candidates == second.run(REQUEST).candidates
    assert answer.steps == 4
