"""Reading a transformers config the way every family must: head layout, per-layer windows, and refusals.

:class:`DecoderArgs` holds what every decoder-only family reads (sizes, heads, rope, windows); a family's own args
extend it with what only it has. Nothing is ignored silently: a field a family does not implement (an unknown
layer type, bidirectional attention, a ``quantization_config`` that no loader reads) is an
:class:`~frame.errors.UnsupportedModelError` whose one sentence names the field. :class:`FamilyOptions` holds the
options every in-tree family accepts (``--model-opt``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from frame.errors import UnsupportedModelError
from frame.interfaces.attention import AttentionSpec
from frame.layers.rotary import rope_parameters

#: ``quant_method`` s whose weights ``frame.weights`` dequantises on load (transformers marks GGUF-read configs so).
LOADED_QUANTIZATIONS = ("gguf",)
#: transformers' ``layer_types`` values frame serves, and whether the layer has a sliding window.
LAYER_TYPES = {"full_attention": False, "sliding_attention": True}


class FamilyOptions(BaseModel):
    """Options of the in-tree model families (``--model-opt key=value``, ``model_options:`` in YAML)."""

    model_config = ConfigDict(extra="forbid")

    disable_sliding_window: bool = Field(
        False, description="attend to every earlier key on every layer, ignoring the checkpoint's sliding windows "
        "(a different model than trained: equal only while sequences fit the window)")


def unsupported(field: str, value: Any, family: str, hint: str = "") -> UnsupportedModelError:
    """The one-sentence refusal of a config field ``family`` does not implement."""
    return UnsupportedModelError(
        f"The config's {field}={value!r} is not implemented by the {family} model family{'; ' + hint if hint else ''}.",
        param="model")


def check_common(config: Any, family: str) -> None:
    """Refuse what no in-tree family implements: quantized checkpoints without a loader, bidirectional attention."""
    quantization = getattr(config, "quantization_config", None)
    method = None
    if quantization:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else getattr(
            quantization, "quant_method", type(quantization).__name__)
        method = getattr(method, "value", method)  # transformers' QuantizationMethod enum
    if quantization and str(method).lower() not in LOADED_QUANTIZATIONS:
        raise UnsupportedModelError(
            f"The config's quantization_config (quant_method {str(method)!r}) has no loader in frame, which reads "
            "unquantised safetensors and GGUF files; serve an unquantised checkpoint or a GGUF file instead.",
            param="model")
    if getattr(config, "use_bidirectional_attention", False):
        raise unsupported("use_bidirectional_attention", True, family, "frame serves causal decoders")


def head_layout(config: Any) -> tuple[int, int, int]:
    """``(query heads, KV heads, head size)``: ``head_dim`` when the config has one, else hidden / heads."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return heads, kv_heads, getattr(config, "head_dim", None) or config.hidden_size // heads


def layer_windows(config: Any, family: str, options: BaseModel | None = None) -> list[int | None]:
    """Each layer's sliding window (None: full attention), from ``layer_types`` and ``sliding_window``.

    Without ``layer_types`` a ``sliding_window`` applies to every layer (Mistral, Mixtral, Phi-3); with it, to the
    ``sliding_attention`` layers (Qwen 2/3 past ``max_window_layers``, Gemma's local layers).
    """
    layers = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is None:
        windows = [window] * layers
    else:
        if len(types) != layers:
            raise unsupported("layer_types", types, family, f"it must list {layers} layers")
        unknown = sorted(set(types) - set(LAYER_TYPES))
        if unknown:
            raise unsupported("layer_types", unknown[0], family, f"frame serves {', '.join(LAYER_TYPES)} layers")
        if "sliding_attention" in types and not window:
            raise unsupported("sliding_window", window, family, "sliding_attention layers need a window")
        windows = [window if LAYER_TYPES[t] else None for t in types]
    if getattr(options, "disable_sliding_window", False):
        return [None] * layers
    return [int(w) if w else None for w in windows]


def architecture_of(config: Any, architectures: dict[str, str], family: str) -> str:
    """The config's architecture (``architectures[0]``, or for configs that name only a ``model_type`` such as
    GGUF-derived ones, ``architectures`` maps the model type); UnsupportedModelError when ``family`` lacks it."""
    named = getattr(config, "architectures", None) or []
    arch = named[0] if named else architectures.get(config.model_type, config.model_type)
    if arch not in architectures.values():
        raise UnsupportedModelError(
            f"The {family} model family builds {', '.join(architectures.values())}, not {arch}.", param="model")
    return arch


@dataclass(frozen=True)
class DecoderArgs:
    """What every decoder-only family reads from its config: sizes, heads, the final norm's epsilon, tied
    embeddings, rope (:func:`~frame.layers.rotary.rope_parameters`) and each layer's window."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    rope: dict[str, Any]
    windows: tuple[int | None, ...]

    @staticmethod
    def read(config: Any, architecture: str, family: str, options: BaseModel | None = None,
             norm_eps: str = "rms_norm_eps") -> dict[str, Any]:
        """The fields above from ``config`` (after :func:`check_common`), as keyword arguments for a subclass."""
        check_common(config, family)
        heads, kv_heads, head_dim = head_layout(config)
        return {
            "architecture": architecture, "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "intermediate_size": getattr(config, "intermediate_size", None) or 4 * config.hidden_size,
            "num_layers": config.num_hidden_layers, "num_heads": heads, "num_kv_heads": kv_heads,
            "head_dim": head_dim, "norm_eps": getattr(config, norm_eps),
            "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
            "max_position_embeddings": getattr(config, "max_position_embeddings", 4096),
            "rope": rope_parameters(config), "windows": tuple(layer_windows(config, family, options)),
        }

    def attention_specs(self, scale: float | None = None, logit_softcap: float | None = None) -> list[AttentionSpec]:
        """The same heads on every layer, a window where the config sets one; ``scale`` (default
        ``head_dim ** -0.5``) and ``logit_softcap`` on every layer."""
        scale = self.head_dim**-0.5 if scale is None else scale
        return [AttentionSpec(self.num_heads, self.num_kv_heads, self.head_dim, scale, window, logit_softcap)
                for window in self.windows]
