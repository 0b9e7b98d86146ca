"""Int4Group128Method: symmetric int4 per group of 128 inputs, in the ``int4_g128`` format this plugin declares."""

from __future__ import annotations

import torch
from frame.interfaces.quantization import PackedFormat, PackedWeight, QuantizationMethod

GROUP = 128


class Int4Group128(PackedWeight):
    """``q`` uint8 ``[out, in / 2]`` (two 4-bit codes a byte, the even input in the low nibble) and ``scale``
    float32 ``[out, in / 128]``: w = scale * (code - 8)."""

    block_inputs = GROUP

    def __init__(self, tensors: dict[str, torch.Tensor], in_features: int) -> None:
        super().__init__("int4_g128", tensors, in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        q = self.tensors["q"]
        codes = torch.stack((q & 0xF, q >> 4), dim=-1).reshape(q.shape[0], -1).float() - 8
        return (codes * self.tensors["scale"].repeat_interleave(GROUP, dim=1)).to(dtype)

    def with_tensors(self, tensors: dict[str, torch.Tensor], in_features: int) -> PackedWeight:
        return Int4Group128(tensors, in_features)

    def narrow_inputs(self, start: int, length: int) -> PackedWeight:
        if start % GROUP or length % GROUP:
            raise ValueError(f"an int4_g128 weight splits its inputs only at multiples of {GROUP}, not at "
                             f"{start}:{start + length}")
        q = self.tensors["q"][:, start // 2 : (start + length) // 2].contiguous()
        scale = self.tensors["scale"][:, start // GROUP : (start + length) // GROUP].contiguous()
        return Int4Group128({"q": q, "scale": scale}, length)


Int4Group128.packed_format = PackedFormat(
    "int4_g128",
    layout="tensors['q'] uint8 [out, in / 2], two 4-bit codes a byte (input 2i in the low nibble, 2i+1 in the "
           "high); tensors['scale'] float32 [out, in / 128]; w[o, i] = scale[o, i // 128] * (code[o, i] - 8)",
    reference=Int4Group128,
    kernels=(),
)


class Int4Group128Method(QuantizationMethod):
    """Every linear weight whose inputs are a multiple of 128, rounded to 15 levels of its group's max ``|w|``."""

    formats = ("int4_g128",)
    packed_formats = (Int4Group128.packed_format,)

    def quantize(self, name: str, weight: torch.Tensor,
                 input_absmax: torch.Tensor | None = None) -> PackedWeight | None:
        rows, inputs = weight.shape
        if inputs % GROUP:
            return None  # kept dense
        w = weight.float().reshape(rows, inputs // GROUP, GROUP)
        scale = (w.abs().amax(dim=-1) / 7).clamp_min(torch.finfo(torch.float32).tiny)
        codes = (torch.round(w / scale[..., None]).clamp_(-7, 7) + 8).to(torch.uint8).reshape(rows, inputs)
        return Int4Group128({"q": codes[:, 0::2] | (codes[:, 1::2] << 4), "scale": scale}, inputs)
