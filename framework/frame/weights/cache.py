"""A converted-weights cache: a GGUF file's dequantised tensors saved once as safetensors, then memory-mapped.

Parsing a GGUF file's metadata (gguf's ``GGUFReader``) and dequantising its tensors takes seconds every time an
engine starts; reading the same float32 tensors back from a safetensors file takes a fraction of that. The file
lives under ``$FRAME_CACHE_DIR/gguf/<key>/weights.safetensors`` (default ``~/.cache/frame``), beside the config
and tokenizer :mod:`frame.model_source` keeps there; the key is a sha256 digest of the GGUF's path, size and
modification time, so an edited or replaced file is converted again. ``FRAME_WEIGHTS_CACHE=0`` turns it off.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from frame.derived_cache import record_and_sweep
from frame.interfaces.model import WeightSource
from frame.paths import gguf_cache_folder
from frame.weights.gguf import GGUFWeights
from frame.weights.progress import track_tensors

log = logging.getLogger("frame.weights")
_FILE = "weights.safetensors"
#: GGUF files smaller than this are read directly: they parse in milliseconds and would only litter the cache.
MIN_BYTES = 8 << 20


def cache_folder(path: Path) -> Path:
    """The cache folder of GGUF file ``path`` (shared with :mod:`frame.model_source`)."""
    return gguf_cache_folder(path)


def enabled() -> bool:
    """False when ``FRAME_WEIGHTS_CACHE`` is ``0``, ``false`` or ``no``."""
    return os.environ.get("FRAME_WEIGHTS_CACHE", "1").lower() not in ("0", "false", "no")


class CachedGGUFWeights(WeightSource):
    """A GGUF's tensors read back from their safetensors conversion: llama.cpp names, float32, GGUF layout."""

    format: Literal["safetensors", "gguf"] = "gguf"

    def __init__(self, file: Path) -> None:
        self.file = file
        with safe_open(file, framework="pt") as handle:
            # safetensors sorts names; the GGUF's own order is kept in the metadata.
            order = (handle.metadata() or {}).get("order")
            self._names = json.loads(order) if order else list(handle.keys())

    def __len__(self) -> int:
        return len(self._names)

    def _read(self) -> Iterator[tuple[str, torch.Tensor]]:
        with safe_open(self.file, framework="pt") as handle:
            for name in self._names:
                yield name, handle.get_tensor(name)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(llama_cpp_name, float32 tensor)`` in the GGUF's order."""
        yield from track_tensors(self._read(), len(self), f"Loading {self.file.parent.name} (cached)")


class CachingGGUFWeights(GGUFWeights):
    """GGUFWeights that, once every tensor has been read, saves them all as the cache's safetensors file."""

    def __init__(self, path: Path, file: Path) -> None:
        super().__init__(path)
        self.file = file

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        kept: dict[str, torch.Tensor] = {}
        for name, tensor in super().tensors():
            kept[name] = tensor
            yield name, tensor
        tmp: str | None = None
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            record_and_sweep(self.file.parent, self.path)
            # Written under a temporary name and renamed: a concurrent reader never sees half a file.
            fd, tmp = tempfile.mkstemp(dir=self.file.parent, suffix=".tmp")
            os.close(fd)
            save_file(kept, tmp, metadata={"order": json.dumps(list(kept))})
            os.replace(tmp, self.file)
        except Exception as exc:  # a read-only or full cache folder only costs speed
            log.warning("could not cache converted weights at %s: %s", self.file, exc)
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)


def open_gguf(path: Path) -> WeightSource:
    """The GGUF's tensors: from the converted-weights cache when it has them, else from the file (filling it)."""
    if not enabled() or path.stat().st_size < MIN_BYTES:
        return GGUFWeights(path)
    file = cache_folder(path) / _FILE
    if file.is_file():
        try:
            return CachedGGUFWeights(file)
        except Exception as exc:  # a corrupt cache file is rebuilt, never fatal
            log.warning("ignoring unreadable weights cache %s: %s", file, exc)
    return CachingGGUFWeights(path, file)
