"""TransformersModel: any decoder-only ``AutoModelForCausalLM`` that no native family claims, run by transformers'
own modules with frame's paged attention in their attention layers (:mod:`frame_model_transformers.attention`).

The flat batch goes through the model as one row with each token's position, so rotary and learned positions are
per token; attention sees only its own sequence through the block tables. Before serving, :meth:`verify` runs a
probe through the loaded model and refuses, in one sentence, a model whose layers ask for another scale, window or
soft-cap than the family stated, or whose logits differ from the output projection's (a post-processing frame does
not know). One rank only; Hugging Face safetensors only.
"""

from __future__ import annotations

import copy
import math

import torch
from frame.errors import UnsupportedModelError
from frame.interfaces.attention import AttentionBackend, AttentionMetadata, AttentionSpec, GroupedMetadata
from frame.interfaces.model import CausalLM, KVCacheSpec, WeightSource
from frame.layers import check_common, head_layout, kv_cache_spec, layer_windows, rope_parameters
from frame.parallel import parallel_context
from frame.weights.full_config import concrete_config
from transformers import AutoModelForCausalLM, PretrainedConfig

from frame_model_transformers.attention import NAME, Step, stepping
from frame_model_transformers.names import renamer

FAMILY = "transformers"
#: Rope types whose frequencies depend on the longest position in the forward call: in a flat batch of several
#: sequences that is another sequence's, so transformers' modules would rotate this one wrongly.
BATCH_DEPENDENT_ROPE = ("dynamic", "longrope")
#: Tensors that some checkpoints carry and the modules recompute.
_RECOMPUTED = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias", ".masked_bias")


def attention_specs(config: PretrainedConfig) -> list[AttentionSpec]:
    """What transformers' modules will ask for, read from the config (checked against them by :meth:`verify`)."""
    check_common(config, FAMILY)
    rope = rope_parameters(config)["rope_type"]
    if rope in BATCH_DEPENDENT_ROPE:
        raise UnsupportedModelError(
            f"The config's rope_parameters.rope_type {rope!r} scales with the longest sequence of a forward call, "
            "which the transformers fallback family cannot keep apart in a batch; no native family builds it.",
            param="model")
    heads, kv_heads, head_dim = head_layout(config)
    scale = getattr(config, "query_pre_attn_scalar", None)
    scale = scale**-0.5 if scale else getattr(config, "attention_multiplier", None) or head_dim**-0.5
    softcap = getattr(config, "attn_logit_softcapping", None)
    return [AttentionSpec(heads, kv_heads, head_dim, scale, window, softcap)
            for window in layer_windows(config, FAMILY)]


def _post_logits(config: PretrainedConfig, logits: torch.Tensor) -> torch.Tensor:
    """The logit post-processing transformers' causal LMs apply that frame knows: scales and a final soft-cap."""
    if getattr(config, "logits_scaling", None):  # Granite-like
        logits = logits / config.logits_scaling
    if getattr(config, "logit_scale", None):  # Cohere-like
        logits = logits * config.logit_scale
    cap = getattr(config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


class TransformersModel(CausalLM):
    """transformers' module tree for ``config`` with frame's attention; ``backends[i]`` serves layer ``i``."""

    def __init__(self, config: PretrainedConfig, backends: list[AttentionBackend], device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.architecture = (getattr(config, "architectures", None) or [config.model_type])[0]
        if parallel_context().is_parallel:
            raise UnsupportedModelError(
                f"The transformers fallback family runs {self.architecture} on one rank only; serve it with "
                "tensor_parallel_size 1.", param="tensor_parallel_size")
        self.specs = attention_specs(config)
        self.backends = backends
        # A GGUF's config arrives as a plain PretrainedConfig holding its class's attributes
        # (frame.weights.full_config); transformers' module tree needs it as that class.
        config = concrete_config(config) if type(config) is PretrainedConfig else copy.deepcopy(config)
        try:  # the weights are loaded next: skip transformers' random initialisation
            from transformers.initialization import no_init_weights
        except ImportError:  # pragma: no cover - older transformers
            from contextlib import nullcontext as no_init_weights
        with no_init_weights():
            self.hf = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=NAME)
        self.hf.to(device).eval()

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return kv_cache_spec(self.specs)

    @torch.inference_mode()
    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata | GroupedMetadata,
    ) -> torch.Tensor:
        """The base model's last hidden states ``[num_tokens, hidden]``; every layer writes its new KV."""
        with stepping(Step(self.backends, kv_caches, meta)):
            out = self.hf.base_model(input_ids=input_ids[None], position_ids=positions[None], use_cache=False)
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return _post_logits(self.hf.config, self.hf.get_output_embeddings()(hidden)).float()

    @torch.inference_mode()
    def load_weights(self, source: WeightSource) -> None:
        """Copy every checkpoint tensor into the parameter of the same name, tie what the model ties, then
        :meth:`verify`; ValueError naming a tensor without a place or a parameter left empty."""
        if source.format != "safetensors":
            raise UnsupportedModelError("The transformers fallback family loads Hugging Face safetensors only; "
                                        "serve this architecture from its safetensors checkpoint.", param="model")
        state = self.hf.state_dict(keep_vars=True)
        rename = renamer(self.hf, self.architecture)
        filled: set[int] = set()
        for name, tensor in source.tensors():
            target = state.get(rename(name))
            if target is None:
                if name.endswith(_RECOMPUTED):
                    continue
                raise ValueError(f"checkpoint tensor {name!r} has no place in {self.architecture}")
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(f"checkpoint tensor {name!r} of shape {tuple(tensor.shape)} does not fit "
                                 f"{tuple(target.shape)}")
            target.data.copy_(tensor)
            filled.add(target.data_ptr())
        self.hf.tie_weights()
        missing = [n for n, t in self.hf.state_dict(keep_vars=True).items() if t.data_ptr() not in filled]
        if missing:
            raise ValueError(f"the checkpoint lacks tensors for: {', '.join(sorted(missing))}")
        self.verify()

    @torch.inference_mode()
    def verify(self) -> None:
        """Probe the loaded model with a few tokens: each layer must ask for the attention its spec states, and
        the logits must be the output projection's (after the post-processing frame knows)."""
        ids = torch.arange(3, device=self.hf.device)[None] % self.hf.config.vocab_size
        with stepping(Step(self.backends)) as probe:
            hidden = self.hf.base_model(input_ids=ids, use_cache=False).last_hidden_state[0]
            expected = self.hf(input_ids=ids, use_cache=False).logits[0].float()
        for layer, spec in enumerate(self.specs):
            asked = probe.asked.get(layer)
            stated = (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.scale, spec.sliding_window,
                      spec.logit_softcap)
            if asked is None or asked[:3] != stated[:3] or not math.isclose(asked[3], spec.scale, rel_tol=1e-6) or (
                    asked[4:] != stated[4:]):
                raise UnsupportedModelError(
                    f"Layer {layer} of {self.architecture} asks for attention (heads, KV heads, head size, scale, "
                    f"window, soft-cap) {asked}, not the {stated} the transformers fallback family read from its "
                    "config; no native family builds it.", param="model")
        if not torch.allclose(self.compute_logits(hidden), expected, atol=1e-3, rtol=1e-3):
            raise UnsupportedModelError(
                f"{self.architecture} changes its logits after the output projection in a way the transformers "
                "fallback family does not know; no native family builds it.", param="model")
