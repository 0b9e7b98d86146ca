"""Mixture of experts: a top-k router, the routed experts as stacked weights, and optional shared experts.

:class:`FusedExperts` is the platform's seam, like the linears': a :class:`KernelLayer` whose ``forward(x, ids,
weights)`` a platform may replace with a fused MoE kernel once the weights are loaded; its torch reference loops
over the experts that were hit. Under tensor parallelism every expert's intermediate features are split over the
ranks (each rank holds a slice of every expert) and :class:`MixtureOfExperts` sums the partial outputs once.

Routing (:class:`Router`): ``softmax`` (Mixtral, Qwen MoE) or ``sigmoid`` (DeepSeek-V3 style) scores in float32,
the top ``k`` experts, optionally renormalised to sum to one and scaled. Shared experts (Qwen2-MoE, DeepSeek) are a
:class:`~frame.layers.mlp.GatedMLP` every token passes through, optionally weighted by a sigmoid gate.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from frame.interfaces.quantization import PackedWeight
from frame.layers.activation import activation
from frame.layers.basic import KernelLayer, Linear, copy_checked, empty_parameter
from frame.layers.mlp import GatedMLP, gated_projection
from frame.parallel import parallel_context

log = logging.getLogger("frame.layers")

Scoring = Literal["softmax", "sigmoid"]


class Router(nn.Module):
    """Scores every expert for every token and keeps the top ``k``: ``(ids [T, k] int64, weights [T, k] float32)``."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, device: torch.device, dtype: torch.dtype, *,
                 scoring: Scoring = "softmax", renormalize: bool = True, scale: float = 1.0) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"cannot route to {top_k} of {num_experts} experts")
        self.gate = Linear(hidden, num_experts, False, device, dtype)
        self.top_k, self.scoring, self.renormalize, self.scale = top_k, scoring, renormalize, scale

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.gate(x).float()
        scores = torch.softmax(logits, dim=-1) if self.scoring == "softmax" else torch.sigmoid(logits)
        weights, ids = torch.topk(scores, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.scale != 1.0:
            weights = weights * self.scale
        return ids, weights


class FusedExperts(KernelLayer):
    """``num_experts`` gated MLPs in two stacked weights: ``w13`` ``[E, 2 * I, H]`` (gate rows, then up rows) and
    ``w2`` ``[E, H, I]``, where ``I`` is this rank's slice of the ``intermediate`` features.

    Checkpoint tensors arrive one expert at a time with parts ``"{e}.gate"``, ``"{e}.up"`` and ``"{e}.down"``
    (``[I_full, H]``, ``[I_full, H]``, ``[H, I_full]``); each keeps this rank's slice. When a quantization plugin
    hands them packed (a GGUF's ``ffn_*_exps`` blocks), :meth:`finish_packed` moves them into one
    :class:`PackedExpert` per expert (:attr:`packed_experts`), whose linears take the platform's packed kernels,
    and frees the dense stacks.
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int, act: str, device: torch.device,
                 dtype: torch.dtype, field: str = "hidden_act") -> None:
        super().__init__()
        self.num_experts, self.full_intermediate = num_experts, intermediate
        self.start, self.size = parallel_context().split(intermediate)
        self.w13 = empty_parameter(num_experts, 2 * self.size, hidden, device=device, dtype=dtype)
        self.w2 = empty_parameter(num_experts, hidden, self.size, device=device, dtype=dtype)
        self.act_name, self.field = act, field
        self.act = activation(act, field)
        self.packed_experts: nn.ModuleList | None = None
        self._packed_parts: dict[tuple[int, str], PackedWeight] = {}
        self._dense_parts = 0

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``sum_k weights[t, k] * expert[ids[t, k]](x[t])`` ``[T, H]`` in ``x``'s dtype (this rank's partial sum)."""
        if self.packed_experts is not None:
            return self.reference(x, ids, weights)
        if self.kernel is not None:
            out = self.kernel(x, ids, weights)
            if out is not None:
                return out
        return self.reference(x, ids, weights)

    def reference(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Loop over the experts some token chose: gather its tokens, run it, add the weighted result."""
        out = torch.zeros_like(x)
        for expert in torch.unique(ids).tolist():
            token, slot = torch.where(ids == expert)
            if self.packed_experts is not None:
                y = self.packed_experts[expert](x[token]).float() * weights[token, slot, None]
            else:
                gate, up = F.linear(x[token], self.w13[expert]).chunk(2, dim=-1)
                y = F.linear(self.act(gate) * up, self.w2[expert]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(x.dtype))
        return out

    def load(self, kind: str, tensor: torch.Tensor, part: str | None = None) -> None:
        expert, _, which = (part or "").partition(".")
        if kind != "weight" or not expert.isdigit() or int(expert) >= self.num_experts or which not in (
                "gate", "up", "down"):
            raise ValueError(f"this layer holds {self.num_experts} experts' gate, up and down weights, not {part!r}")
        e = int(expert)
        if isinstance(tensor, PackedWeight):
            self._packed_parts[(e, which)] = tensor
            return
        self._dense_parts += 1
        if which == "down":
            if tensor.shape[-1] != self.full_intermediate:
                raise ValueError(f"a down weight of {tensor.shape[-1]} inputs does not fit {self.full_intermediate}")
            copy_checked(self.w2.data[e], tensor.narrow(-1, self.start, self.size), "weight")
            return
        if tensor.shape[0] != self.full_intermediate:
            raise ValueError(f"a {which} weight of {tensor.shape[0]} rows does not fit {self.full_intermediate}")
        rows = slice(0, self.size) if which == "gate" else slice(self.size, 2 * self.size)
        copy_checked(self.w13.data[e, rows], tensor.narrow(0, self.start, self.size), "weight")

    def load_targets(self) -> list[tuple[str, str | None]]:
        """Every ``(kind, part)`` a checkpoint must fill."""
        return [("weight", f"{e}.{which}") for e in range(self.num_experts) for which in ("gate", "up", "down")]

    def finish_packed(self) -> None:
        """After loading: give the experts whose weights arrived packed their :class:`PackedExpert` modules (the
        loader then joins each one's gate and up rows), or, if some parts arrived dense too, dequantize the packed
        ones into the dense stacks."""
        parts, self._packed_parts = self._packed_parts, {}
        if not parts:
            return
        if self._dense_parts:
            log.info("an MoE layer's experts arrived partly dense; the packed ones are dequantized")
            for (e, which), packed in parts.items():
                self.load("weight", packed.dequantize(self.w13.dtype), f"{e}.{which}")
            return
        device, dtype = self.w13.device, self.w13.dtype
        hidden = self.w13.shape[-1]
        self.packed_experts = nn.ModuleList(
            PackedExpert(hidden, self.full_intermediate, self.act_name, device, dtype, self.field)
            for _ in range(self.num_experts))
        for (e, which), packed in parts.items():
            self.packed_experts[e].load(which, packed)
        self.w13 = self.w2 = None  # the packed experts hold every weight


class PackedExpert(nn.Module):
    """One expert of :class:`FusedExperts` whose weights stay packed: its gate-up projection and its down
    projection as linears (this rank's slice of the intermediate features), so a platform's kernels for packed
    linears run it. Its output is this rank's partial sum; the MoE block reduces once over the ranks."""

    def __init__(self, hidden: int, intermediate: int, act: str, device: torch.device, dtype: torch.dtype,
                 field: str) -> None:
        super().__init__()
        self.gate_up = gated_projection(hidden, intermediate, act, False, device, dtype, field)
        self.start, size = self.gate_up.output_range
        self.full_intermediate = intermediate
        self.down = Linear(size, hidden, False, device, dtype)

    def load(self, which: str, packed: PackedWeight) -> None:
        """Keep this rank's slice of the expert's ``gate``, ``up`` or ``down`` weight."""
        if which == "down":
            if packed.shape[-1] != self.full_intermediate:
                raise ValueError(f"a down weight of {packed.shape[-1]} inputs does not fit {self.full_intermediate}")
            copy_checked(self.down.weight, packed.narrow(-1, self.start, self.down.weight.shape[-1]), "weight")
        else:
            self.gate_up.load("weight", packed, which)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate_up(x))


class MixtureOfExperts(nn.Module):
    """A sparse MoE feed-forward block: ``router`` picks experts, ``experts`` run them, ``shared_expert`` (when
    ``shared_intermediate``) runs for every token, scaled by ``sigmoid(shared_expert_gate(x))`` when
    ``shared_gate``. Module names are what checkpoint name maps target."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, device: torch.device,
                 dtype: torch.dtype, *, act: str = "silu", scoring: Scoring = "softmax", renormalize: bool = True,
                 routed_scale: float = 1.0, shared_intermediate: int = 0, shared_gate: bool = False) -> None:
        super().__init__()
        self.router = Router(hidden, num_experts, top_k, device, dtype, scoring=scoring, renormalize=renormalize,
                             scale=routed_scale)
        self.experts = FusedExperts(num_experts, hidden, intermediate, act, device, dtype)
        self.shared_expert = GatedMLP(hidden, shared_intermediate, act, False, device, dtype) \
            if shared_intermediate else None
        self.shared_expert_gate = Linear(hidden, 1, False, device, dtype) if shared_intermediate and shared_gate \
            else None
        self.parallel = parallel_context()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.router(x)
        out = self.parallel.all_reduce(self.experts(x, ids, weights))
        if self.shared_expert is not None:
            shared = self.shared_expert(x)  # already summed over the ranks by its down projection
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out
