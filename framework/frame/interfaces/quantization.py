"""QuantizationMethod: how a checkpoint's linear weights are kept quantized, and the packed weights it makes.

A quantization plugin (``--quantization NAME``, or the checkpoint's ``quantization_config``) decides, at load, which
linear weights stay (or become) quantized, and in which packed formats: the core's (:data:`FORMATS`, which the
in-tree platforms have kernels for) or formats of its own, each declared as a :class:`PackedFormat` (name, layout,
the :class:`PackedWeight` class whose ``dequantize`` is its reference, the platforms with kernels for it) on the
weight class (:attr:`PackedWeight.packed_format`) and listed by the method
(:attr:`QuantizationMethod.packed_formats`). It either reads them packed from the checkpoint
(:meth:`QuantizationMethod.open_weights`: ``gguf`` keeps a GGUF file's blocks) or quantizes dense ones once they are
loaded (:meth:`QuantizationMethod.quantize`: ``int8`` per output channel). A layer then holds a
:class:`PackedWeight` instead of a dense weight, and the platform supplies a kernel per format
(:meth:`frame.interfaces.platform.Platform.layer_kernel` sees the layer's packed weight); where it has none, the
layer multiplies by :meth:`PackedWeight.dequantize`'s result, which is also the reference the kernels are tested
against.

Every tensor of a packed weight has the weight's output features as its first dimension, so the loading code
that shards, permutes and concatenates a checkpoint's rows (tensor parallelism, fused QKV and gate-up layers,
llama.cpp's rotary row order) works on packed weights unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from frame.interfaces.model import WeightSource

#: The packed formats a plugin may produce and a platform may supply kernels for, with their layouts. Each is a
#: contract between the two: a plugin's weight of that format holds exactly these tensors.
FORMATS: dict[str, str] = {
    "q4_0": "ggml block_q4_0: tensors['blocks'] uint8 [out, in / 32 * 18]; per 32 inputs, fp16 d then 16 bytes of "
            "nibbles (low nibbles inputs 0-15, high 16-31); w = d * (q - 8)",
    "q4_1": "ggml block_q4_1: tensors['blocks'] uint8 [out, in / 32 * 20]; per 32 inputs, fp16 d, fp16 m, then 16 "
            "bytes of nibbles as q4_0; w = d * q + m",
    "q8_0": "ggml block_q8_0: tensors['blocks'] uint8 [out, in / 32 * 34]; per 32 inputs, fp16 d then 32 int8 q; "
            "w = d * q",
    "q5_0": "ggml block_q5_0: tensors['blocks'] uint8 [out, in / 32 * 22]; per 32 inputs, fp16 d, a little-endian "
            "uint32 whose bit i is input i's fifth bit, 16 bytes of nibbles as q4_0; w = d * (q - 16)",
    "q5_1": "ggml block_q5_1: tensors['blocks'] uint8 [out, in / 32 * 24]; per 32 inputs, fp16 d, fp16 m, then the "
            "high bits and nibbles as q5_0; w = d * q + m",
    "iq4_nl": "ggml block_iq4_nl: tensors['blocks'] uint8 [out, in / 32 * 18]; per 32 inputs, fp16 d then 16 bytes "
              "of nibbles as q4_0; w = d * kvalues_iq4nl[q] (16 int8 levels, -127 to 113)",
    "q2_k": "ggml block_q2_K: tensors['blocks'] uint8 [out, in / 256 * 84]; per 256 inputs, 16 bytes of 4-bit "
            "scales and mins for 16 sub-blocks of 16, 64 bytes of 2-bit values, fp16 d, fp16 dmin",
    "q3_k": "ggml block_q3_K: tensors['blocks'] uint8 [out, in / 256 * 110]; per 256 inputs, 32 bytes of high bits, "
            "64 of 2-bit values, 12 of 6-bit scales for 16 sub-blocks of 16, fp16 d",
    "q4_k": "ggml block_q4_K: tensors['blocks'] uint8 [out, in / 256 * 144]; per 256 inputs, fp16 d, fp16 dmin, 12 "
            "bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes of nibbles",
    "q6_k": "ggml block_q6_K: tensors['blocks'] uint8 [out, in / 256 * 210]; per 256 inputs, 128 bytes of low "
            "nibbles, 64 of high 2-bit pairs, 16 int8 sub-block scales, fp16 d",
    "q5_k": "ggml block_q5_K: tensors['blocks'] uint8 [out, in / 256 * 176]; q4_K's d, dmin and scales, 32 bytes of "
            "fifth bits, 128 bytes of nibbles",
    "iq4_xs": "ggml block_iq4_xs: tensors['blocks'] uint8 [out, in / 256 * 136]; per 256 inputs, fp16 d, 6-bit "
              "scales for 8 sub-blocks of 32 (2 + 4 bytes), 128 bytes of nibbles as iq4_nl's",
    "mixed": "frame.weights.MixedRows: attribute parts, packed weights in formats of their own, each a block of "
             "output rows, one after another (a fused QKV whose V a GGUF stores in q6_K beside q4_K Q and K); "
             "tensors['rows'] an empty [out, 0] placeholder; w = the parts' rows stacked",
    "int8": "per output channel: tensors['q'] int8 [out, in], tensors['scale'] float32 [out, 1]; w = scale * q; "
            "attribute activations 'dynamic' (x may be quantized per row, W8A8) or 'none' (weight-only); attribute "
            "input_scale float32 [in] or None (smoothed: w = scale * q * input_scale per input feature, so the int8 "
            "product takes x * input_scale)",
}


@dataclass(frozen=True)
class PackedFormat:
    """A packed format a quantization plugin declares for itself (beside the core's :data:`FORMATS`).

    ``layout`` says in words which tensors a weight of the format holds and how they give ``w`` (what a platform
    needs to write a kernel for it); ``reference`` is the :class:`PackedWeight` class whose ``dequantize`` is the
    reference every kernel of it matches (and what a layer multiplies by where no kernel serves it); ``kernels``
    names the platforms that have a kernel for it (none: every platform runs the reference).
    """

    name: str
    layout: str
    reference: type[PackedWeight]
    kernels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.name in FORMATS:
            raise ValueError(f"the packed format {self.name!r} is one of frame's own; name yours otherwise")
        if not self.layout.strip():
            raise ValueError(f"the packed format {self.name!r} needs its layout in words")


class PackedWeight(ABC):
    """A linear weight ``[out, in]`` kept quantized: ``format`` (a key of :data:`FORMATS`, or the name of the
    class's own :attr:`packed_format`) and its tensors.

    Every tensor in :attr:`tensors` has ``out`` rows first; :meth:`rows` and :meth:`cat` select and join output
    features across all of them, so the loading code's row operations (``narrow(0, ...)``, indexing by a row
    order) apply as they do to a dense tensor. Subclasses implement :meth:`dequantize` (the reference) and
    :meth:`with_tensors` (a weight of the same kind over other rows).
    """

    #: Inputs per block: a narrow along the inputs must start and end on a block boundary.
    block_inputs: int = 1
    #: The format a plugin declares for this class's weights, when it is not one of :data:`FORMATS`.
    packed_format: ClassVar[PackedFormat | None] = None

    def __init__(self, format: str, tensors: dict[str, torch.Tensor], in_features: int) -> None:
        own = type(self).packed_format
        if format not in FORMATS and (own is None or format != own.name):
            known = ", ".join([*FORMATS, *([own.name] if own else [])])
            raise ValueError(f"unknown packed format {format!r} for {type(self).__name__}; known: {known} (a "
                             f"format of a plugin's own is declared as the weight class's packed_format)")
        rows = {t.shape[0] for t in tensors.values()}
        if len(rows) != 1:
            raise ValueError(f"the tensors of a {format} weight disagree on the number of rows: {sorted(rows)}")
        self.format = format
        self.tensors = tensors
        self.in_features = in_features

    @property
    def shape(self) -> torch.Size:
        """The dense weight's shape ``[out, in]``."""
        return torch.Size((next(iter(self.tensors.values())).shape[0], self.in_features))

    @property
    def nbytes(self) -> int:
        """Bytes the packed tensors take."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @abstractmethod
    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense weight ``[out, in]`` in ``dtype``: the reference every kernel of this format matches."""

    @abstractmethod
    def with_tensors(self, tensors: dict[str, torch.Tensor], in_features: int) -> PackedWeight:
        """A weight of this class and format over ``tensors`` (other rows, or a slice of the inputs)."""

    def rows(self, index: slice | torch.Tensor) -> PackedWeight:
        """The output features ``index`` selects (a slice or a 1-D tensor of row numbers), of every tensor."""
        return self.with_tensors({k: t[index].contiguous() for k, t in self.tensors.items()}, self.in_features)

    def __getitem__(self, index: slice | torch.Tensor) -> PackedWeight:
        """Rows, as ``tensor[index]`` selects them from a dense weight."""
        return self.rows(index)

    def split(self, sizes: Sequence[int]) -> list[PackedWeight]:
        """``tensor.split(sizes)`` along the rows (a fused checkpoint tensor cut into its parts: Phi-3's QKV)."""
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [self.rows(slice(start, start + size)) for start, size in zip(starts, sizes, strict=True)]

    def narrow(self, dim: int, start: int, length: int) -> PackedWeight:
        """``torch.narrow`` for the loaders: any rows (``dim`` 0), or inputs on block boundaries (``dim`` 1/-1)."""
        if dim == 0:
            return self.rows(slice(start, start + length))
        if dim not in (1, -1):
            raise ValueError(f"a packed weight has 2 dimensions, not {dim + 1}")
        if start == 0 and length == self.in_features:
            return self
        return self.narrow_inputs(start, length)

    def narrow_inputs(self, start: int, length: int) -> PackedWeight:
        """Inputs ``[start, start + length)`` (tensor-parallel row splits); formats that cannot split raise."""
        raise ValueError(f"a {self.format} weight cannot be split along its inputs at {start}:{start + length}")

    def resolved(self) -> PackedWeight:
        """This weight with tensors of its own (itself, but for a weight that makes them on demand:
        :class:`~frame.weights.reordered.ReorderedRows`)."""
        return self

    def file_views(self) -> Iterable[torch.Tensor]:
        """The tensors that may view a file's memory map: a kernel that made its own copy gives their pages back."""
        return self.tensors.values()

    @staticmethod
    def cat(parts: Sequence[PackedWeight]) -> PackedWeight | None:
        """The parts' rows one after another, or None when they differ in format or inputs (the caller keeps them
        dense then). One part is returned as it is (no copy: its blocks may be a file's memory map)."""
        parts = [p.resolved() for p in parts]
        first = parts[0]
        if len(parts) == 1:
            return first
        if any(type(p) is not type(first) or p.format != first.format or p.in_features != first.in_features
               or p.tensors.keys() != first.tensors.keys() for p in parts):
            return None
        return first.with_tensors({k: torch.cat([p.tensors[k] for p in parts]) for k in first.tensors},
                                  first.in_features)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.format}, shape={tuple(self.shape)}, {self.nbytes} bytes)"


class QuantizationMethod(ABC):
    """What one quantization plugin does to a model at load (one instance per engine, from
    ``frame_quantization_create``). The methods are called in this order by every model worker:

    1. :meth:`check` before the model is built: refuse a checkpoint the method cannot serve, in one sentence.
    2. :meth:`open_weights` to read the checkpoint: a source whose linear weights may arrive as
       :class:`PackedWeight` (the model family hands them to its layers as it does tensors); None to read it
       with the core's dense readers.
    3. :meth:`calibration_text`, after every tensor is loaded: a method that returns text has the dense model run
       over it once (:mod:`frame.engine.worker.calibration`), and each linear layer's largest ``|x|`` per input feature
       is recorded.
    4. :meth:`quantize` once per linear layer whose weight arrived dense, with those maxima as ``input_absmax``
       when the method asked for them.
    """

    #: The plugin's name (``--quantization``), set by the plugin.
    name: str = ""
    #: The formats this method's weights come in; ``frame plugins`` shows which of them the platform serves natively.
    formats: tuple[str, ...] = ()
    #: The formats of its own among them (not in :data:`FORMATS`), declared: layout, reference, kernels.
    packed_formats: tuple[PackedFormat, ...] = ()

    def check(self, model_path: Path, hf_config: object) -> str | None:
        """None when this method can serve the checkpoint at ``model_path``; else one sentence why not."""
        return None

    def open_weights(self, model_path: Path) -> WeightSource | None:
        """A source whose linear weights arrive packed, or None (the default) to load the checkpoint dense."""
        return None

    def calibration_text(self) -> str | None:
        """Text whose activations this method wants to see before it quantizes (SmoothQuant-style smoothing, which
        moves the activations' outlier features into the weights), or None (the default) to quantize the weights
        alone. Called once per worker, after loading; the text is tokenized with the model's tokenizer and run in
        chunks of the engine's context length at most."""
        return None

    @abstractmethod
    def quantize(self, name: str, weight: torch.Tensor,
                 input_absmax: torch.Tensor | None = None) -> PackedWeight | None:
        """The packed form of the dense linear weight ``weight`` ``[out, in]`` of the layer at module path
        ``name`` (``layers.3.mlp.down_proj``), or None to keep it dense. Pure: ``weight`` is not modified.
        ``input_absmax`` float32 ``[in]``: the layer's largest ``|x|`` per input feature over the calibration text,
        passed only to methods whose :meth:`calibration_text` is not None (None for a layer the text never
        reached)."""
