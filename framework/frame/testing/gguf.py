"""Writing a Hugging Face checkpoint as a llama.cpp GGUF file, for model families' GGUF tests.

Names come from gguf-py's own table (``gguf.get_tensor_name_map``, the one llama.cpp's converter uses), so a family's
GGUF names are checked against llama.cpp's rather than against themselves. Experts saved one tensor each
(``...experts.3.gate_proj``) are stacked into llama.cpp's ``ffn_*_exps`` tensors. What llama.cpp's converter does to
an architecture's values (Llama's Q/K row interleaving, Gemma's ``+ 1`` on norms, GPT-2's transposed Conv1D weights)
is the caller's ``convert``; :func:`llama_cpp_permute` is the first of those.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch

from frame.interfaces.model import WeightSource

_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(.+)$")


class NoLlamaCppName(ValueError):
    """llama.cpp's architecture has no name for a tensor of the checkpoint (a variant llama.cpp does not run)."""


def llama_cpp_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """What llama.cpp's converter does to Llama's Q/K rows: each head's two rotary halves interleaved."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, half, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def _stacked(source: WeightSource) -> dict[str, torch.Tensor]:
    """Every tensor by name, per-expert tensors stacked under the expert-less name (``...experts.gate_proj``)."""
    tensors: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in source.tensors():
        match = _EXPERT.match(name)
        if match is None:
            tensors[name] = tensor
        else:
            experts.setdefault(f"{match.group(1)}.{match.group(3)}", {})[int(match.group(2))] = tensor
    for name, by_index in experts.items():
        tensors[name] = torch.stack([by_index[i] for i in sorted(by_index)])
    return tensors


def write_gguf(source: WeightSource, path: Path, architecture: str, num_layers: int,
               convert: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> None:
    """Write ``source`` (Hugging Face names) to ``path`` as llama.cpp architecture ``architecture`` (a
    ``gguf.MODEL_ARCH`` member name such as ``"QWEN3"``), float32; ``convert(hf_name, tensor)`` first."""
    arch = gguf.MODEL_ARCH[architecture]
    names = gguf.get_tensor_name_map(arch, num_layers)
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    for name, tensor in _stacked(source).items():
        stem, _, kind = name.rpartition(".")
        mapped = names.get_name(stem)
        if mapped is None:
            raise NoLlamaCppName(f"llama.cpp has no {architecture} name for {name!r}")
        value = convert(name, tensor) if convert is not None else tensor
        writer.add_tensor(f"{mapped}.{kind}", np.ascontiguousarray(value.float().numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
