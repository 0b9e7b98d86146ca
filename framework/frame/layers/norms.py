"""Norms beyond Llama's :class:`~frame.layers.basic.RMSNorm`: LayerNorm, an RMS norm whose weight multiplies in
float32 (OLMo 2; Gemma, whose weights are offsets from one), and the query/key norms some families apply per head
or across all heads before rotary.

Each keeps the residual convention of :class:`~frame.layers.basic.RMSNorm` where a family needs it:
``norm(x, residual)`` returns ``(norm(x + residual), x + residual)``. They are :class:`KernelLayer` s of their own
(not subclasses of ``RMSNorm``), so a platform kernel written for Llama's norm never serves them by mistake.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from frame.layers.basic import KernelLayer, copy_checked, empty_parameter
from frame.parallel import HeadPartition, parallel_context


class ResidualNorm(KernelLayer):
    """A norm that may add the residual stream first: ``norm(x, residual)`` returns ``(norm(x + residual),
    x + residual)``, without ``residual`` ``(norm(x), x)``. Subclasses give :meth:`reference`; a platform kernel
    takes the sum."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        if self.kernel is not None:
            out = self.kernel(x)
            if out is not None:
                return out, x
        return self.reference(x), x

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The torch computation of the norm of ``x``."""
        raise NotImplementedError

    def load(self, kind: str, tensor: torch.Tensor, part: str | None = None) -> None:
        copy_checked(getattr(self, kind, None), tensor, kind)

    def load_parts(self) -> list[str | None]:
        return [None]


class LayerNorm(ResidualNorm):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` in the input's dtype, as ``torch.nn.LayerNorm`` (GPT-2)."""

    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype, bias: bool = True) -> None:
        super().__init__()
        self.weight = empty_parameter(size, device=device, dtype=dtype)
        self.bias = empty_parameter(size, device=device, dtype=dtype) if bias else None
        self.eps = eps

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class UpcastRMSNorm(ResidualNorm):
    """RMS norm computed and weighted in float32, rounded once at the end: ``(norm(x) * (offset + w)).to(dtype)``.

    OLMo 2 uses ``offset`` 0; Gemma stores its weights as offsets from one (``offset`` 1). Llama's norm rounds before
    the weight multiplies (:class:`~frame.layers.basic.RMSNorm`); in float32 the two agree.
    """

    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = empty_parameter(size, device=device, dtype=dtype)
        self.eps = eps
        self.offset = offset

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (h * (self.offset + self.weight.float())).to(x.dtype)


class HeadNorm(KernelLayer):
    """An RMS norm of queries or keys before rotary, applied in place to ``[tokens, heads, head_dim]``.

    ``per_head``: over each head's ``head_dim`` features with one ``[head_dim]`` weight (Qwen 3, Gemma 3). Otherwise
    over all ``total_heads * head_dim`` features of the projection (OLMo 2): the weight is ``[total_heads * head_dim]``
    in the checkpoint, this rank keeps its heads' slice, and with several ranks the sum of squares is summed over them
    (a KV head replicated on several ranks counts once). ``upcast`` weights in float32 like :class:`UpcastRMSNorm`
    (with its ``offset``); otherwise the normalised value is rounded before the weight multiplies, like Llama's norm.
    """

    def __init__(self, head_dim: int, total_heads: int, heads: tuple[int, int], eps: float, *, per_head: bool,
                 device: torch.device, dtype: torch.dtype, upcast: bool = False, offset: float = 0.0,
                 counts_once: bool = True) -> None:
        """``heads`` is this rank's ``(first head, count)``; ``counts_once`` False on every replica of a KV head
        but the first, so a norm across heads sums each head once."""
        super().__init__()
        self.per_head, self.upcast, self.offset, self.eps = per_head, upcast, offset, eps
        self.head_dim, self.full_width = head_dim, total_heads * head_dim
        self.start, self.count = heads
        self.counts_once = counts_once
        self.parallel = parallel_context()
        width = head_dim if per_head else self.count * head_dim
        self.weight = empty_parameter(width, device=device, dtype=dtype)

    @classmethod
    def for_queries_and_keys(cls, head_dim: int, num_heads: int, num_kv_heads: int, heads: HeadPartition, eps: float,
                             **kwargs) -> tuple[HeadNorm, HeadNorm]:
        """The query norm and the key norm of one layer, for this rank's ``heads``."""
        group = num_heads // num_kv_heads
        q = cls(head_dim, num_heads, (heads.q_start, heads.q_count), eps, **kwargs)
        k = cls(head_dim, num_kv_heads, (heads.kv_start, heads.kv_count), eps,
                counts_once=heads.q_start == heads.kv_start * group, **kwargs)
        return q, k

    def forward(self, x: torch.Tensor) -> None:
        """Normalise ``x`` ``[tokens, heads, head_dim]`` (rows may be strided) in place."""
        if self.kernel is not None and self.kernel(x) is not None:
            return
        tokens = x.shape[0]
        h = x.float()
        if self.per_head:
            h = F.rms_norm(h, (self.head_dim,), eps=self.eps)
        else:
            squares = h.square().sum(dim=(1, 2), keepdim=True)
            if self.parallel.is_parallel:
                squares = self.parallel.all_reduce(squares if self.counts_once else torch.zeros_like(squares))
            h = h * torch.rsqrt(squares / self.full_width + self.eps)
        weight = self.weight.view(-1, self.head_dim) if not self.per_head else self.weight
        out = (h * (self.offset + weight.float())).to(x.dtype) if self.upcast else weight * h.to(x.dtype)
        x.copy_(out.view(tokens, -1, self.head_dim))

    def load(self, kind: str, tensor: torch.Tensor, part: str | None = None) -> None:
        """The whole checkpoint weight: ``[head_dim]`` per head, else ``[total_heads * head_dim]`` (sliced here)."""
        if not self.per_head:
            if tensor.shape[0] != self.full_width:
                raise ValueError(f"a checkpoint norm of {tensor.shape[0]} features does not fit {self.full_width}")
            tensor = tensor.narrow(0, self.start * self.head_dim, self.count * self.head_dim)
        copy_checked(self.weight, tensor, "weight")

    def load_parts(self) -> list[str | None]:
        return [None]
