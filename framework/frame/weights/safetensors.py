"""SafetensorsWeights: a Hugging Face checkpoint folder read tensor by tensor, without pickle."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch
from safetensors import safe_open

from frame.interfaces.model import WeightSource
from frame.weights.progress import track_tensors

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


class SafetensorsWeights(WeightSource):
    """Every tensor of every ``*.safetensors`` file in a folder, with Hugging Face names.

    Files are memory-mapped and read one tensor at a time, so loading never holds a second copy of the model.
    A folder whose only weights are pickles (``pytorch_model.bin``) is refused with a ValueError.
    """

    format: Literal["safetensors", "gguf"] = "safetensors"

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.files = sorted(self.folder.glob("*.safetensors"))
        if not self.files:
            pickles = sorted(p.name for p in self.folder.iterdir() if p.suffix in _PICKLE_SUFFIXES)
            if pickles:
                raise ValueError(
                    f"{self.folder} holds only pickled weights ({', '.join(pickles)}), which frame does not load "
                    "because unpickling can run arbitrary code; convert them to safetensors."
                )
            raise ValueError(f"{self.folder} has no *.safetensors files")
        self._names: list[tuple[Path, str]] = []
        for file in self.files:
            with safe_open(file, framework="pt") as handle:
                self._names.extend((file, name) for name in handle.keys())  # noqa: SIM118 - not a dict

    def __len__(self) -> int:
        return len(self._names)

    def _read(self) -> Iterator[tuple[str, torch.Tensor]]:
        for file in self.files:
            with safe_open(file, framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - not a dict
                    yield name, handle.get_tensor(name)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, tensor)`` in file order, each tensor on the CPU in its stored dtype."""
        yield from track_tensors(self._read(), len(self), f"Loading {self.folder.name}")
