"""Self-attention over paged KV, as model families build it: the QKV projection split by heads, optional query/key
norms, rotary in place, the layer's attention backend, and the output projection summed over the ranks.

:func:`layer_backends` checks the backends the core made (one per distinct :class:`AttentionSpec`) against the
family's specs, and :func:`kv_cache_layout` says which cache each layer writes or, for a layer that shares KV,
reads. Module names are what checkpoint name maps target: ``qkv`` (parts ``q``, ``k``, ``v``), ``o_proj``, and
``q_norm``/``k_norm`` when the layer has them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from frame.interfaces.attention import AttentionBackend, AttentionMetadata, AttentionSpec
from frame.interfaces.model import KVCacheSpec
from frame.layers.basic import RotateHalves
from frame.layers.norms import HeadNorm
from frame.layers.parallel import ColumnParallelLinear, OutputPart, QKVParallelLinear, RowParallelLinear, local_heads

Rope = tuple[torch.Tensor, torch.Tensor]
KVCache = tuple[torch.Tensor, torch.Tensor]


def layer_backends(specs: list[AttentionSpec], attention: AttentionBackend,
                   layer_attention: list[AttentionBackend] | None) -> list[AttentionBackend]:
    """Each layer's backend (``layer_attention``, or ``attention`` for every layer when it is None), checked to
    compute what the layer's spec asks for on this rank's heads; ValueError naming the first layer that differs."""
    backends = list(layer_attention) if layer_attention is not None else [attention] * len(specs)
    if len(backends) != len(specs):
        raise ValueError(f"got attention backends for {len(backends)} layers, the model has {len(specs)}")
    for i, (spec, backend) in enumerate(zip(specs, backends, strict=True)):
        heads = local_heads(spec.num_heads, spec.num_kv_heads)
        wanted = (heads.q_count, heads.kv_count, spec.head_dim, spec.sliding_window, spec.logit_softcap)
        got = (backend.num_heads, backend.num_kv_heads, backend.head_dim, getattr(backend, "sliding_window", None),
               getattr(backend, "logit_softcap", None))
        if got != wanted or not math.isclose(backend.scale, spec.scale, rel_tol=1e-6):
            raise ValueError(
                f"layer {i} needs attention over {wanted[0]} heads / {wanted[1]} KV heads of size {wanted[2]} with "
                f"scale {spec.scale:g}{''.join(', ' + f for f in spec.features)}, but its backend was made for "
                f"{got[0]} / {got[1]} of size {got[2]} with scale {backend.scale:g}"
                f"{''.join(', ' + f for f in backend.spec.features) if hasattr(backend, 'spec') else ''}"
            )
    return backends


def kv_cache_layout(specs: list[AttentionSpec]) -> list[int]:
    """For each layer, the index of the KV cache it uses: its own, or its ``kv_source`` layer's."""
    own: dict[int, int] = {}
    layout = []
    for i, spec in enumerate(specs):
        if spec.kv_source is None:
            own[i] = len(own)
            layout.append(own[i])
        else:
            layout.append(layout[spec.kv_source])
    return layout


def kv_cache_spec(specs: list[AttentionSpec]) -> KVCacheSpec:
    """The KV pool of ``specs`` on this rank: one cache per layer that does not share another's."""
    heads = local_heads(specs[0].num_heads, specs[0].num_kv_heads)
    return KVCacheSpec(sum(s.kv_source is None for s in specs), heads.kv_count, specs[0].head_dim)


class SelfAttention(nn.Module):
    """One layer's attention: ``o_proj(attend(rotary(norm(q)), rotary(norm(k)), v))``.

    ``rotary_dim`` features of each query and key head rotate (all of them by default; 0: none, for families with
    learned positions). ``qk_norm`` adds :class:`~frame.layers.norms.HeadNorm` s for queries and keys, built with
    those keyword arguments (``per_head``, ``upcast``, ``offset``) and the ``norm_eps``. A layer whose spec has a
    ``kv_source`` projects queries only (its ``qkv`` has the one part ``q``) and reads that layer's cache.
    """

    def __init__(self, hidden: int, spec: AttentionSpec, backend: AttentionBackend, device: torch.device,
                 dtype: torch.dtype, *, qkv_bias: bool = False, o_bias: bool = False, rotary_dim: int | None = None,
                 qk_norm: dict | None = None, norm_eps: float = 1e-6) -> None:
        super().__init__()
        d = spec.head_dim
        heads = local_heads(spec.num_heads, spec.num_kv_heads)  # this rank's share
        self.writes_kv = spec.kv_source is None
        if self.writes_kv:
            self.qkv: ColumnParallelLinear = QKVParallelLinear(hidden, d, spec.num_heads, spec.num_kv_heads, qkv_bias,
                                                               device, dtype)
        else:  # it reads another layer's keys and values: queries only
            self.qkv = ColumnParallelLinear(hidden, [OutputPart("q", spec.num_heads * d, heads.q_start * d,
                                                                heads.q_count * d)], qkv_bias, device, dtype)
        self.num_heads, self.num_kv_heads, self.head_dim = heads.q_count, heads.kv_count, d
        # kv_size: the width of K (and of V) in the projection's output.
        self.q_size, self.kv_size = heads.q_count * d, heads.kv_count * d if self.writes_kv else 0
        self.o_proj = RowParallelLinear(spec.num_heads * d, hidden, o_bias, device, dtype,
                                        input_range=(heads.q_start * d, self.q_size))
        self.rotary_dim = d if rotary_dim is None else rotary_dim
        self.rotate = RotateHalves()
        self.has_qk_norm = qk_norm is not None
        if qk_norm is not None:
            q_norm, k_norm = HeadNorm.for_queries_and_keys(d, spec.num_heads, spec.num_kv_heads, heads, norm_eps,
                                                           device=device, dtype=dtype, **qk_norm)
            self.q_norm = q_norm
            if self.writes_kv:
                self.k_norm = k_norm
        self.backend = backend

    def forward(self, x: torch.Tensor, rope: Rope | None, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        tokens = x.shape[0]
        qkv = self.qkv(x)
        if self.has_qk_norm:
            self.q_norm(qkv[:, : self.q_size].view(tokens, -1, self.head_dim))
            if self.writes_kv:
                self.k_norm(qkv[:, self.q_size : self.q_size + self.kv_size].view(tokens, -1, self.head_dim))
        if rope is not None and self.rotary_dim:
            # Q and K sit side by side in qkv, so one rotary pass covers both.
            qk = qkv[:, : self.q_size + self.kv_size].view(tokens, -1, self.head_dim)
            if self.rotary_dim == self.head_dim:
                self.rotate(qk, *rope)
            else:  # partial rotary: a strided slice, which platform kernels do not take
                RotateHalves.reference(qk[..., : self.rotary_dim], *rope)
        q = qkv[:, : self.q_size].reshape(tokens, self.num_heads, self.head_dim)
        if not self.writes_kv:
            out = self.backend.attend(q.contiguous(), cache[0], cache[1], meta)
            return self.o_proj(out.reshape(tokens, self.q_size))
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(tokens, self.num_kv_heads, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].reshape(tokens, self.num_kv_heads, self.head_dim)
        if not self.backend.accepts_strided_tokens:  # the others may assume contiguous inputs
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = self.backend.forward(q, k, v, cache[0], cache[1], meta)
        return self.o_proj(out.reshape(tokens, self.q_size))
