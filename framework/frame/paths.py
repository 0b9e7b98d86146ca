"""Where frame keeps what it derives once and reuses: converted checkpoints, built kernels, exports."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """``$FRAME_CACHE_DIR``, default ``~/.cache/frame``."""
    return Path(os.environ.get("FRAME_CACHE_DIR", Path.home() / ".cache" / "frame"))


def gguf_cache_folder(path: Path) -> Path:
    """The folder holding what frame derives from GGUF file ``path`` (config, tokenizer, converted weights), keyed
    by its resolved path, size and modification time so an edited file gets a fresh folder."""
    path = path.resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    return cache_root() / "gguf" / key
