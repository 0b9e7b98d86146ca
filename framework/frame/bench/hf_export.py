"""A GGUF checkpoint as a Hugging Face folder (safetensors, config, tokenizer), exported once and reused.

transformers reads a GGUF by parsing every metadata field in Python and dequantising each tensor: about 30 s for
SmolLM2-135M on a 2-core machine, on every load. The transformers baseline of ``frame bench``, the correctness
references of the tests and vLLM (``benchmarks/compare_vllm.py``, whose CPU build cannot serve Q4_1) all load the
same dequantised weights, so they are written once under ``$FRAME_CACHE_DIR/hf-export/`` and loaded from there in
about a second. The tensors are transformers' own dequantisation, byte for byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch
import transformers

from frame.derived_cache import current_key, sweep, write_record
from frame.model_source import ModelSource
from frame.paths import cache_root


def export_folder(source: ModelSource, dtype: torch.dtype) -> Path:
    """``source`` as a Hugging Face folder in ``dtype`` (the checkpoint's own folder when it is not a GGUF)."""
    if not source.is_gguf:
        return source.path
    path = source.path.resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}:{dtype}:{transformers.__version__}".encode())
    folder = cache_root() / "hf-export" / key.hexdigest()[:24]
    if (folder / "config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder.parent))
    try:
        _write(source, dtype, staging)
        write_record(staging, path, **current_key("hf-export"))
        with contextlib.suppress(OSError):  # another process finished the same export first: keep its folder
            os.rename(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    sweep(folder.parent, current_key("hf-export"))
    return folder


def _write(source: ModelSource, dtype: torch.dtype, folder: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the conversion bar would interleave with the caller's output
    model = AutoModelForCausalLM.from_pretrained(source.path.parent, gguf_file=source.path.name, dtype=dtype)
    # transformers refuses to save a GGUF-loaded model, so its (dequantised) tensors are written directly.
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    source.tokenizer.save_pretrained(folder)
