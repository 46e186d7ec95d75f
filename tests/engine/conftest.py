"""Engine fixtures: one real tiny DiffusionGemma runtime per test session."""

import pytest

from dgemma_lsp.engine.runtime.denoising import DenoisingRuntime


@pytest.fixture(scope="session")
def runtime() -> DenoisingRuntime:
    return DenoisingRuntime.load("tiny-random")
