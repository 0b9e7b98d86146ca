"""Checkpoint tensor names -> the layers of a model family: Hugging Face (safetensors) and llama.cpp (GGUF) names.

A :class:`NameMap` holds a family's rules: whole names for the tensors outside the decoder layers, and for each
layer the name below its prefix (``model.layers.3.`` or ``blk.3.``) mapped to the module inside frame's layer and
the fused part it fills. The ``LLAMA_*`` tables are the names of a Llama-style decoder layer, which most families
share (with additions of their own), mapped to the module names :class:`~frame.layers.attention.SelfAttention`
and :class:`~frame.layers.mlp.GatedMLP` use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from frame.weights.loading import Placement, Target

#: Hugging Face names inside ``model.layers.N.``, for a layer with ``attn``, ``mlp``, ``input_norm`` and
#: ``post_attn_norm``.
HF_LLAMA_LAYER: dict[str, tuple[str, str | None]] = {
    "self_attn.q_proj": ("attn.qkv", "q"), "self_attn.k_proj": ("attn.qkv", "k"),
    "self_attn.v_proj": ("attn.qkv", "v"), "self_attn.o_proj": ("attn.o_proj", None),
    "self_attn.q_norm": ("attn.q_norm", None), "self_attn.k_norm": ("attn.k_norm", None),
    "mlp.gate_proj": ("mlp.gate_up", "gate"), "mlp.up_proj": ("mlp.gate_up", "up"),
    "mlp.down_proj": ("mlp.down_proj", None), "input_layernorm": ("input_norm", None),
    "post_attention_layernorm": ("post_attn_norm", None),
}
#: The same layer in llama.cpp's GGUF names (inside ``blk.N.``).
GGUF_LLAMA_LAYER: dict[str, tuple[str, str | None]] = {
    "attn_q": ("attn.qkv", "q"), "attn_k": ("attn.qkv", "k"), "attn_v": ("attn.qkv", "v"),
    "attn_output": ("attn.o_proj", None), "attn_q_norm": ("attn.q_norm", None),
    "attn_k_norm": ("attn.k_norm", None), "ffn_gate": ("mlp.gate_up", "gate"), "ffn_up": ("mlp.gate_up", "up"),
    "ffn_down": ("mlp.down_proj", None), "attn_norm": ("input_norm", None), "ffn_norm": ("post_attn_norm", None),
}
#: Tensors outside the layers: embedding, final norm, output projection.
HF_LLAMA_TOP = {"model.embed_tokens": "embed_tokens", "model.norm": "norm", "lm_head": "lm_head"}
GGUF_LLAMA_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
#: Tensors some checkpoints carry that the network recomputes (rotary tables).
IGNORED = r"(rotary_emb\.inv_freq|rope_freqs\.weight|rope_factors_(long|short)\.weight|\.attn\.(masked_)?bias)$"

_KIND = re.compile(r"^(.+)\.(weight|bias)$")


@dataclass(frozen=True)
class NameMap:
    """One family's names in one checkpoint format.

    ``top`` maps a name without its ``.weight``/``.bias`` to a module path; ``layer`` maps what follows
    ``layer_prefix`` (a regex whose group 1 is the layer index) to ``(module inside layer_path, part)``, and
    ``layer_patterns`` does the same for regexes (the part a template over their groups: experts' names carry an
    index, ``mlp.experts.(digits).gate_proj`` to ``("mlp.experts", "<index>.gate")``); ``ignored`` (a regex) names
    tensors to skip; ``what`` names the model in errors.
    """

    top: dict[str, str]
    layer: dict[str, tuple[str, str | None]]
    layer_prefix: str
    num_layers: int
    what: str
    layer_path: str = "layers.{}"
    ignored: str = IGNORED
    layer_patterns: dict[str, tuple[str, str]] = field(default_factory=dict)
    _prefix: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_prefix", re.compile(self.layer_prefix + r"(.+)$"))

    @classmethod
    def hf(cls, num_layers: int, what: str, top: dict[str, str] | None = None,
           layer: dict[str, tuple[str, str | None]] | None = None, prefix: str = r"model\.layers\.(\d+)\.",
           patterns: dict[str, tuple[str, str]] | None = None) -> NameMap:
        """Hugging Face names: Llama's tables updated with ``top`` and ``layer``, plus ``patterns``."""
        return cls({**HF_LLAMA_TOP, **(top or {})}, {**HF_LLAMA_LAYER, **(layer or {})}, prefix, num_layers, what,
                   layer_patterns=patterns or {})

    @classmethod
    def gguf(cls, num_layers: int, what: str, top: dict[str, str] | None = None,
             layer: dict[str, tuple[str, str | None]] | None = None) -> NameMap:
        """llama.cpp names: Llama's tables updated with ``top`` and ``layer``."""
        return cls({**GGUF_LLAMA_TOP, **(top or {})}, {**GGUF_LLAMA_LAYER, **(layer or {})}, r"blk\.(\d+)\.",
                   num_layers, what)

    def target(self, name: str) -> Target | None:
        """Where tensor ``name`` goes; None for one to skip; ValueError naming it when it has no place."""
        if self.ignored and re.search(self.ignored, name):
            return None
        kind_match = _KIND.match(name)
        if kind_match is not None:
            stem, kind = kind_match.groups()
            if stem in self.top:
                return self.top[stem], kind, None
            layer_match = self._prefix.match(stem)
            if layer_match is not None and int(layer_match.group(1)) < self.num_layers:
                index, inner = layer_match.groups()
                rule = self.layer.get(inner)
                if rule is None:
                    rule = self._pattern_rule(inner)
                if rule is not None:
                    module, part = rule
                    return f"{self.layer_path.format(index)}.{module}", kind, part
        raise ValueError(f"checkpoint tensor {name!r} has no place in {self.what}")

    def _pattern_rule(self, inner: str) -> tuple[str, str | None] | None:
        for pattern, (module, template) in self.layer_patterns.items():
            match = re.fullmatch(pattern, inner)
            if match is not None:
                return module, match.expand(template)
        return None

    def place(self, name: str, tensor: torch.Tensor) -> list[Placement] | None:
        """:meth:`target` as a placement list (the :data:`~frame.weights.loading.Placer` form). A part ``"*.x"``
        names a stack of experts' tensors ``[E, ...]`` (GGUF's ``ffn_*_exps``): one placement ``"{e}.x"`` each."""
        target = self.target(name)
        if target is None:
            return None
        path, kind, part = target
        if part is not None and part.startswith("*."):
            return [((path, kind, each), piece) for each, piece in unstack_experts(tensor, part[2:])]
        return [(target, tensor)]


def split_rows(tensor: torch.Tensor, parts: list[tuple[str, int]]) -> list[tuple[str, torch.Tensor]]:
    """A fused checkpoint tensor cut along its rows into named parts of the given sizes (Phi-3's ``qkv_proj``)."""
    sizes = [size for _, size in parts]
    if tensor.shape[0] != sum(sizes):
        raise ValueError(f"a fused tensor of {tensor.shape[0]} rows does not split into {sizes}")
    return [(name, piece) for (name, _), piece in zip(parts, tensor.split(sizes), strict=True)]


def unstack_experts(tensor: torch.Tensor, which: str) -> list[tuple[str, torch.Tensor]]:
    """A 3-D stack of experts' weights ``[E, ...]`` as per-expert parts ``"{e}.{which}"`` (GGUF's ``*_exps``)."""
    return [(f"{e}.{which}", tensor[e]) for e in range(tensor.shape[0])]
