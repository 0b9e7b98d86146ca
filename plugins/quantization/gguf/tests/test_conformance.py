"""frame's quantization conformance suite, run on the gguf plugin with the bundled Q4_1 GGUF (it reads weights
packed from a GGUF file, so the suite's dense default checkpoint is not one it serves)."""

from __future__ import annotations

from pathlib import Path

import pytest
from frame import default_model_path
from frame.testing.quantization import QuantizationConformance


class TestGGUFConformance(QuantizationConformance):
    plugin_name = "gguf"

    @pytest.fixture(scope="class")
    def checkpoint(self) -> Path:
        return default_model_path()
