"""The KV cache's dtype (``--kv-cache-dtype``): the model's own, another float, or 8-bit codes with scales.

A float KV pool holds each token's K and V rows ``[kv_heads, head_dim]`` as they are. A quantized pool (``int8`` or
``fp8``, torch's ``float8_e4m3fn``) holds for each token and KV head a row of ``head_dim`` 8-bit codes followed by
that row's float32 scale (4 bytes, stored in the same tensor), so its per-layer caches are ``[blocks, block_size,
kv_heads, head_dim + 4]`` in the code dtype: a block copy, a prefix-cache hit and a draft model move the scales with
the codes, and nothing but the backends needs to know. The scale of a row is ``max |x| / qmax`` (``qmax`` 127 for
int8, 448 for fp8), so every row uses the codes' whole range; a value is ``code * scale``. Per-token rows are
written once, like a float row: appending a token never re-quantizes a block.

A backend declares the KV dtypes it reads (``frame_attention_kv_dtypes``); :func:`quantize_rows` and
:func:`dequantize_rows` are the reference every backend's write and read are checked against.
"""

from __future__ import annotations

import torch

#: ``--kv-cache-dtype`` values and the pool dtype each names (``auto``: the model's dtype, resolved at start).
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None, "bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16,
    "int8": torch.int8, "fp8": torch.float8_e4m3fn,
}
#: Float KV dtypes: every backend reads these (its kernels take a cache of another float dtype than the model's).
FLOAT_KV_DTYPES = ("float32", "bfloat16", "float16")
#: Bytes of the float32 scale after each quantized row's codes.
SCALE_BYTES = 4
#: The largest code magnitude of each quantized dtype.
_QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The ``--kv-cache-dtype`` spelling of a pool dtype (``int8``, ``fp8``, ``bfloat16``)."""
    for name, value in KV_CACHE_DTYPES.items():
        if value == dtype:
            return name
    return str(dtype).removeprefix("torch.")


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool dtype ``--kv-cache-dtype name`` means for a model computing in ``model_dtype``."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown KV cache dtype {name!r}; use one of: {', '.join(KV_CACHE_DTYPES)}")
    return KV_CACHE_DTYPES[name] or model_dtype


def is_quantized(dtype: torch.dtype) -> bool:
    """True for the 8-bit code dtypes whose rows carry a scale."""
    return dtype in _QMAX


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of one token's row per KV head in a pool of ``dtype``: ``head_dim``, plus the scale's 4 bytes when
    quantized."""
    return head_dim + SCALE_BYTES if is_quantized(dtype) else head_dim


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one token's K and V take over all layers, scales included."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_kv_heads * row_width(head_dim, dtype) * itemsize


def quantize_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` ``[..., head_dim]`` (any float dtype) as packed rows ``[..., head_dim + 4]`` of ``dtype``: codes, then
    the row's float32 scale ``max |x| / qmax`` (1 for a row of zeros)."""
    qmax = _QMAX[dtype]
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    scaled = xf / scale
    codes = scaled.round().clamp_(-qmax, qmax).to(torch.int8) if dtype == torch.int8 else scaled.to(dtype)
    out = torch.empty((*x.shape[:-1], x.shape[-1] + SCALE_BYTES), dtype=dtype, device=x.device)
    out[..., : x.shape[-1]] = codes
    out[..., x.shape[-1] :] = scale.contiguous().view(dtype)
    return out


def scales_of(rows: torch.Tensor) -> torch.Tensor:
    """The float32 scales ``[..., 1]`` of packed rows ``[..., head_dim + 4]`` (a copy; rows may be any view)."""
    return rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows ``[..., head_dim + 4]`` back to values ``[..., head_dim]`` in ``dtype``."""
    return (rows[..., :-SCALE_BYTES].float() * scales_of(rows)).to(dtype)


def read_rows(cache: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A pool's rows as values in ``dtype``: dequantized when the pool is quantized, else converted (a no-op in
    the same dtype)."""
    return dequantize_rows(cache, dtype) if is_quantized(cache.dtype) else cache.to(dtype)


def store_rows(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """New K or V rows ``[..., head_dim]`` as a pool of ``cache_dtype`` stores them (quantized, or converted)."""
    return quantize_rows(x, cache_dtype) if is_quantized(cache_dtype) else x.to(cache_dtype)


def write_rows(cache: torch.Tensor, slot_mapping: torch.Tensor, x: torch.Tensor) -> None:
    """Store new rows ``x`` ``[tokens, kv_heads, head_dim]`` at ``slot_mapping`` of a per-layer ``cache``
    ``[blocks, block_size, kv_heads, width]`` (quantizing them for a quantized pool): the torch reference of a
    backend's ``write_kv``."""
    rows = store_rows(x, cache.dtype)
    flat = cache.view(-1, *cache.shape[2:])
    if cache.element_size() == 1:  # torch has no index_copy_ for float8 on every device: copy the bytes
        flat, rows = flat.view(torch.uint8), rows.view(torch.uint8)
    flat.index_copy_(0, slot_mapping.long(), rows)
