"""Checkpoint readers: a Hugging Face folder of ``*.safetensors`` or one ``.gguf`` file, as a WeightSource.

:func:`open_weights` picks the reader from the path; model families consume the result in ``load_weights``.
Pickled checkpoints (``*.bin``, ``*.pt``) are refused: loading them can run arbitrary code. A GGUF's dequantised
tensors are cached as safetensors after the first load (:mod:`frame.weights.cache`).
"""

from __future__ import annotations

from pathlib import Path

from frame.interfaces.model import WeightSource
from frame.weights.cache import open_gguf
from frame.weights.ggml import GGMLExperts, GGMLWeight
from frame.weights.gguf import GGUFWeights
from frame.weights.mixed import MixedRows
from frame.weights.safetensors import SafetensorsWeights


def open_weights(path: str | Path) -> WeightSource:
    """The weights at ``path``: a ``.gguf`` file or a folder of ``*.safetensors``; ValueError otherwise."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return open_gguf(path)
    if path.is_dir():
        return SafetensorsWeights(path)
    raise ValueError(f"{path} is neither a .gguf file nor a folder of *.safetensors files")


__all__ = ["GGMLExperts", "GGMLWeight", "GGUFWeights", "MixedRows", "SafetensorsWeights", "open_weights"]
