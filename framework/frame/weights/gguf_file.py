"""Opening a ``.gguf`` file: gguf's reader, with a cut-short download named in one sentence, and its metadata.

gguf's ``GGUFReader`` maps the file and slices each tensor out of the map; a file shorter than its tensor table
says (a download cut short) fails inside numpy with "cannot reshape array of size ...". :func:`read_gguf` checks
every tensor's extent against the file's size first and says what happened and what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, ReaderField

from frame.errors import ModelNotFoundError


class TruncatedGGUFError(ModelNotFoundError):
    """The file ends before a tensor its table lists does (a download cut short)."""

    code = "truncated_gguf"


class _CheckedReader(GGUFReader):
    """GGUFReader that checks every tensor lies inside the file before slicing it out."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        super().__init__(path)

    def _build_tensors(self, start_offs: int, fields: list[ReaderField]) -> None:
        size = len(self.data)
        for field in fields:
            _, name, _, dims, raw_type, offset = field.parts
            try:
                block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_type[0]))]
            except (ValueError, KeyError):
                continue  # a type gguf does not know: its own error says so below
            end = int(start_offs + offset[0]) + int(np.prod(dims)) * block_bytes // block
            if end > size:
                raise TruncatedGGUFError(
                    f"{self.path.name} is shorter than its tensor table says (tensor "
                    f"'{bytes(name).decode(errors='replace')}' ends at byte {end:,}, the file has {size:,}): the "
                    "download was cut short; download the file again.", param="model")
        super()._build_tensors(start_offs, fields)


def read_gguf(path: str | Path) -> GGUFReader:
    """gguf's reader over ``path``; a :class:`TruncatedGGUFError` when a tensor ends past the end of the file."""
    return _CheckedReader(path)


def metadata(reader: GGUFReader, skip_prefix: str = "tokenizer.ggml.") -> dict[str, Any]:
    """Every metadata key's value but the tokenizer's arrays (tens of thousands of strings no config needs)."""
    return {name: field.contents() for name, field in reader.fields.items()
            if not (name.startswith(skip_prefix) and len(field.data) > 1)}
