"""The pieces of a Llama decoder layer: attention with a fused QKV projection and a SwiGLU MLP.

Norms and linears are the core's layers, so platform kernels serve them and tensor parallelism shards them: the
QKV projection by heads, the SwiGLU projection by intermediate features, and the output and down projections
sum their partial products over the ranks. The family holds no communication code of its own."""

from __future__ import annotations

import torch
from frame.interfaces.attention import AttentionBackend, AttentionMetadata
from frame.layers import QKVParallelLinear, RMSNorm, RotateHalves, RowParallelLinear, SwiGLUProjection
from torch import nn

from frame_model_llama.args import LlamaArgs


class Attention(nn.Module):
    """Self-attention: one QKV matmul, rotary on Q and K in place, then the paged attention backend."""

    def __init__(self, args: LlamaArgs, backend: AttentionBackend, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.qkv = QKVParallelLinear(args.hidden_size, args.head_dim, args.num_heads, args.num_kv_heads, args.qkv_bias,
                                     device, dtype)
        heads = self.qkv.heads  # this rank's share
        self.num_heads, self.num_kv_heads, self.head_dim = heads.q_count, heads.kv_count, args.head_dim
        self.q_size, self.kv_size = heads.q_count * args.head_dim, heads.kv_count * args.head_dim
        self.o_proj = RowParallelLinear(args.num_heads * args.head_dim, args.hidden_size, args.o_bias, device, dtype,
                                        input_range=(heads.q_start * args.head_dim, self.q_size))
        self.rotate = RotateHalves()
        self.backend = backend

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        qkv = self.qkv(x)
        # Q and K sit side by side in qkv, so one rotary pass covers both.
        self.rotate(qkv[:, : self.q_size + self.kv_size].view(tokens, -1, self.head_dim), *rope)
        q = qkv[:, : self.q_size].reshape(tokens, self.num_heads, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(tokens, self.num_kv_heads, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].reshape(tokens, self.num_kv_heads, self.head_dim)
        if not self.backend.accepts_strided_tokens:  # the others may assume contiguous inputs
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = self.backend.forward(q, k, v, cache[0], cache[1], meta)
        return self.o_proj(out.reshape(tokens, self.q_size))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with gate, up and the activation in one layer."""

    def __init__(self, args: LlamaArgs, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_up = SwiGLUProjection(args.hidden_size, args.intermediate_size, args.mlp_bias, device, dtype)
        self.down_proj = RowParallelLinear(args.intermediate_size, args.hidden_size, args.mlp_bias, device, dtype,
                                           input_range=self.gate_up.output_range)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP; the residual stream is carried beside the hidden states."""

    def __init__(self, args: LlamaArgs, backend: AttentionBackend, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_norm = RMSNorm(args.hidden_size, args.rms_norm_eps, device, dtype)
        self.attn = Attention(args, backend, device, dtype)
        self.post_attn_norm = RMSNorm(args.hidden_size, args.rms_norm_eps, device, dtype)
        self.mlp = MLP(args, device, dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, rope: tuple[torch.Tensor, torch.Tensor],
        cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp output, residual)``; the next layer's norm adds the two."""
        h, residual = self.input_norm(x, residual)
        h, residual = self.post_attn_norm(self.attn(h, rope, cache, meta), residual)
        return self.mlp(h), residual
