"""The wheel carries what the package reads at run time: HumanEval's data and licence, and the trained tiny model."""

import subprocess
import sys
import zipfile
from pathlib import Path

from dgemma_lsp.bench import humaneval
from dgemma_lsp.engine.model import tiny_model

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_carries_the_data_files_and_the_build_has_no_complaint(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(tmp_path),
         str(REPO)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    # Every install printed setuptools' banner while a data folder was not declared a package.
    assert "absent from the `packages` configuration" not in built.stdout + built.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()

    def shipped(folder: str) -> set[str]:
        return {Path(name).name for name in names if f"/{folder}/" in name}

    assert {*humaneval.SUBSETS.values(), "LICENSE"} <= shipped("bench/data")
    assert shipped("model/data/tiny") == {path.name for path in tiny_model.shipped_tiny_dir().iterdir()}
    assert {"diffusiongemma-26B-A4B-it.json", "gemma-4-26B-A4B.json"} <= shipped("model/configs")  # doctor reads them
