"""Engine fixtures: one real tiny DiffusionGemma runtime per test session.

TRITON_INTERPRET is set here, before any engine test module is collected: the kernels' decorators read it
once, at their first import, in whichever module imports them first. The whole suite had it set already (a
kernel test module of tests/bench is collected first); `pytest tests/engine` imported the kernels compiled
through test_checkpoint_formats, and 80 interpreted tests after it failed ("Cannot call @triton.jit'd
outside of the scope of a kernel"). tests/conftest.py unsets it again for each test that is not a kernel
test. Not in tests/conftest.py: `make dryrun` (tests/dryrun) needs the kernels compiled, for fake CUDA.
"""

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

from dgemma_lsp.engine.runtime.denoising import DenoisingRuntime


@pytest.fixture(scope="session")
def runtime() -> DenoisingRuntime:
    return DenoisingRuntime.load("tiny-random")
