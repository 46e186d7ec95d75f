"""Training fixtures: the micro recipe every test that trains a run uses (a few seconds a step on one core)."""

import json

import pytest

MICRO = {
    "seed": 0,
    "data": {"languages": ["python"], "corpusBytes": 300000, "tokenizerVocab": 600, "maxPromptTokens": 256,
             "contextTokens": [32, 96]},
    "model": {"hidden": 32, "intermediate": 64, "layers": 2, "heads": 2, "kvHeads": 1, "headDim": 16,
              "slidingWindow": 32, "experts": 2, "topK": 1, "moeIntermediate": 32, "canvas": 16, "spareIds": 64},
    "train": {"steps": 3, "batch": 2, "lr": 0.003, "warmup": 1, "weightDecay": 0.1, "clipNorm": 1.0,
              "selfConditioning": 0.5, "encoderLossWeight": 1.0, "eps": 0.001, "checkpointEvery": 1,
              "snapshotEveryCpuS": 10**6},  # no snapshot on the way: only the one each schedule ends with
    "generation": {"steps": 4, "entropyBound": 0.1},
}


@pytest.fixture
def micro_recipe(tmp_path):
    """The micro recipe as a file for `dgemma-lsp train --config`."""
    path = tmp_path / "micro.json"
    path.write_text(json.dumps(MICRO))
    return path
