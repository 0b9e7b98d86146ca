"""A transformers config rebuilt from a llama.cpp GGUF file's metadata, for every architecture frame's families serve.

A GGUF has no ``config.json``: its metadata is the config, under llama.cpp's key names (``gemma3.block_count``).
transformers' own GGUF reader covers some architectures, drops what frame needs of others (Gemma 3's local and
global rope bases and layer pattern, Gemma 2's soft-caps, MoE widths, Granite's multipliers, LongRoPE and
Llama 3's rope factors, which the converter stores as tensors) and refuses OLMo 2 and Granite outright, so frame
reads the metadata itself. Each builder below states what llama.cpp's converter wrote for one architecture, and
what llama.cpp itself assumes where the file says nothing (Gemma 3's five local layers to each global one and its
local rope base of 10,000; Gemma 2/3's query scale by ``head_dim``, except the 27B models).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader

from frame.errors import UnsupportedModelError
from frame.weights.gguf_file import metadata, read_gguf

#: Marks a config.json frame wrote from a GGUF's metadata (an older cache entry, written by transformers' reader,
#: lacks it and is rebuilt). Version 2 holds its transformers class's defaults too (:mod:`frame.weights.full_config`).
MARKER = "frame_gguf_config"
MARKER_VERSION = 2


class Metadata:
    """One file's metadata, read under its architecture's prefix, with its tensors' names and shapes."""

    def __init__(self, reader: GGUFReader, path: Path) -> None:
        self.reader, self.path = reader, path
        self.values = metadata(reader)
        self.arch = str(self.values["general.architecture"])
        # GGUF lists dimensions fastest first: reversed, they are torch's.
        self.shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        """``{arch}.{key}``'s value, else ``default``."""
        return self.values.get(f"{self.arch}.{key}", default)

    def need(self, key: str) -> Any:
        """``{arch}.{key}``'s value; an UnsupportedModelError naming the key when the file lacks it."""
        value = self.get(key)
        if value is None:
            raise UnsupportedModelError(f"{self.path.name} lacks {self.arch}.{key}, which llama.cpp's converter "
                                        "writes; convert the checkpoint again with llama.cpp's converter.",
                                        param="model")
        return value

    def has(self, tensor: str) -> bool:
        return tensor in self.shapes

    def tensor(self, name: str) -> list[float]:
        """A small float tensor's values (the rope factors the converter stores as tensors)."""
        data = next(t for t in self.reader.tensors if t.name == name).data
        return [float(v) for v in np.asarray(data, dtype=np.float32).reshape(-1)]


def _common(m: Metadata) -> dict[str, Any]:
    """The keys every decoder writes: sizes, heads, norm epsilon, vocabulary, tied output, special tokens."""
    heads = int(m.need("attention.head_count"))
    kv = m.get("attention.head_count_kv", heads)
    hidden = int(m.need("embedding_length"))
    if "token_embd.weight" not in m.shapes:
        raise UnsupportedModelError(f"{m.path.name} has no token_embd.weight tensor, which every model llama.cpp's "
                                    "converter writes has; convert the checkpoint again.", param="model")
    config = {
        "hidden_size": hidden, "num_hidden_layers": int(m.need("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(max(kv) if isinstance(kv, list) else kv),
        "max_position_embeddings": int(m.get("context_length", 2048)),
        "vocab_size": m.shapes["token_embd.weight"][0],
        # llama.cpp's converter writes the output projection only when it is not the embedding matrix
        "tie_word_embeddings": not m.has("output.weight"),
        "rms_norm_eps": float(m.get("attention.layer_norm_rms_epsilon", 1e-6)),
        "head_dim": int(m.get("attention.key_length", hidden // heads)),
        "attention_bias": m.has("blk.0.attn_q.bias"),
    }
    if m.get("feed_forward_length") is not None:
        config["intermediate_size"] = int(m.get("feed_forward_length"))
    for name, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        value = m.values.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            config[f"{name}_token_id"] = int(value)
    return config


def _llama3_factors(theta: float, head_dim: int, factor: float, low: float, high: float,
                    original: float) -> np.ndarray:
    """Llama 3's rope factor of each frequency, as llama.cpp's converter computes it."""
    wavelengths = 2 * math.pi * theta ** (np.arange(0, head_dim, 2) / head_dim)
    smooth = np.clip((original / wavelengths - low) / (high - low), 0.0, 1.0)
    return 1 / ((1 - smooth) / factor + smooth)


def _llama3_rope(m: Metadata, theta: float, head_dim: int) -> dict[str, Any]:
    """Llama 3.x's rope, whose per-frequency factors the converter stores as ``rope_freqs.weight`` and whose
    parameters it drops. The factors fix the parameters up to a common scale (``original / (high - low)`` and
    ``low / (high - low)``, which is all the computation reads): they are fitted on the frequencies between the
    two plateaus, or taken as Meta's (1, 4, 8,192) when fewer than two lie there, and checked."""
    factors = np.array(m.tensor("rope_freqs.weight"), dtype=np.float64)
    factor = float(factors.max())
    low, high, original = 1.0, 4.0, 8192.0
    between = (factors > 1 + 1e-6) & (factors < factor - 1e-6)
    inverse_wavelengths = 1 / (2 * math.pi * theta ** (np.arange(0, head_dim, 2) / head_dim))
    smooth = (1 / factors - 1 / factor) / (1 - 1 / factor) if factor > 1 else factors * 0
    if between.sum() >= 2:  # smooth = original / (high - low) / wavelength - low / (high - low)
        slope, intercept = np.polyfit(inverse_wavelengths[between], smooth[between], 1)
        if intercept < 0:
            low, high, original = 1.0, 1.0 - 1 / intercept, -slope / intercept
    elif between.sum() == 1:  # Meta's low and high, and the one context length that gives this factor
        original = float((3 * smooth[between][0] + 1) / inverse_wavelengths[between][0])
    original = float(round(original)) if abs(original - round(original)) < 1e-3 else original
    params = {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low,
              "high_freq_factor": high, "original_max_position_embeddings": original}
    if factor > 1 and np.allclose(_llama3_factors(theta, head_dim, factor, low, high, original), factors, rtol=1e-4):
        return params
    raise UnsupportedModelError(f"The GGUF's rope_freqs.weight holds rope factors that match no Llama 3 rope scaling "
                                f"(largest factor {factor}); serve the original checkpoint folder instead.",
                                param="model")


def _rope(m: Metadata, head_dim: int) -> dict[str, Any]:
    """``rope_parameters`` from the rope keys (and Llama 3's factor tensor)."""
    theta = float(m.get("rope.freq_base", 10000.0))
    kind = m.get("rope.scaling.type", "none")
    if m.has("rope_freqs.weight"):
        return _llama3_rope(m, theta, head_dim)
    if kind == "none":
        return {"rope_type": "default", "rope_theta": theta}
    factor = float(m.get("rope.scaling.factor", 1.0))
    if kind == "linear":
        return {"rope_type": "linear", "rope_theta": theta, "factor": factor}
    if kind == "yarn":
        params = {"rope_type": "yarn", "rope_theta": theta, "factor": factor,
                  "original_max_position_embeddings": int(m.need("rope.scaling.original_context_length"))}
        for key in ("beta_fast", "beta_slow"):
            if m.get(f"rope.scaling.yarn_{key}") is not None:
                params[key] = float(m.get(f"rope.scaling.yarn_{key}"))
        return params
    raise UnsupportedModelError(f"The GGUF's {m.arch}.rope.scaling.type is '{kind}', which frame does not read; "
                                "serve the original checkpoint folder instead.", param="model")


def _llama(m: Metadata) -> dict[str, Any]:
    """llama.cpp's ``llama``: Llama, Mistral (a window when the file states one) and Mixtral (experts)."""
    config = _common(m)
    config["head_dim"] = int(m.get("attention.key_length", m.get("rope.dimension_count", config["head_dim"])))
    config["rope_parameters"] = _rope(m, config["head_dim"])
    config["mlp_bias"] = m.has("blk.0.ffn_up.bias")
    window = m.get("attention.sliding_window")
    if m.get("expert_count"):
        config.update(model_type="mixtral", num_local_experts=int(m.get("expert_count")),
                      num_experts_per_tok=int(m.get("expert_used_count")), sliding_window=window)
        if m.get("expert_feed_forward_length"):
            config["intermediate_size"] = int(m.get("expert_feed_forward_length"))
    elif window:
        config.update(model_type="mistral", sliding_window=int(window))
    else:
        config["model_type"] = "llama"
    return config


def _granite(m: Metadata) -> dict[str, Any]:
    """IBM Granite: Llama with four multipliers."""
    config = _llama(m)
    config.update(model_type="granite", embedding_multiplier=float(m.get("embedding_scale", 1.0)),
                  residual_multiplier=float(m.get("residual_scale", 1.0)),
                  attention_multiplier=float(m.get("attention.scale", config["head_dim"] ** -0.5)),
                  logits_scaling=float(m.get("logit_scale", 1.0)))
    return config


def _decoder(model_type: str) -> Callable[[Metadata], dict[str, Any]]:
    """The common keys and the rope: Gemma, OLMo 2, Qwen2, Qwen3, and the Qwens' MoE forms (Qwen2-MoE's shared
    expert; Qwen3-MoE renormalises its top-k weights, as llama.cpp does)."""
    def build(m: Metadata) -> dict[str, Any]:
        config = _common(m)
        config.update(model_type=model_type, rope_parameters=_rope(m, config["head_dim"]))
        if m.get("expert_count"):
            config.update(num_experts=int(m.get("expert_count")), num_experts_per_tok=int(m.need("expert_used_count")),
                          moe_intermediate_size=int(m.need("expert_feed_forward_length")),
                          norm_topk_prob=model_type == "qwen3_moe", decoder_sparse_step=1, mlp_only_layers=[])
            if m.get("expert_shared_feed_forward_length"):
                config["shared_expert_intermediate_size"] = int(m.get("expert_shared_feed_forward_length"))
        return config
    return build


def _query_scalar(config: dict[str, Any], layers_27b: int) -> int:
    """What llama.cpp scales Gemma 2/3 queries by: ``head_dim``, but ``hidden / heads`` for the 27B model."""
    if config["num_hidden_layers"] == layers_27b:
        return config["hidden_size"] // config["num_attention_heads"]
    return int(config["head_dim"])


def _gemma2(m: Metadata) -> dict[str, Any]:
    """Gemma 2: a window on every other layer (the first local), two soft-caps."""
    config = _decoder("gemma2")(m)
    layers = config["num_hidden_layers"]
    config.update( sliding_window=int(m.get("attention.sliding_window", 4096)),
                  layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
                  attn_logit_softcapping=m.get("attn_logit_softcapping"),
                  final_logit_softcapping=m.get("final_logit_softcapping"),
                  query_pre_attn_scalar=_query_scalar(config, 46))
    return config


def _gemma3_layers(m: Metadata, layers: int) -> list[str]:
    """Which layers are local: the file's pattern (a period or one flag a layer), else llama.cpp's five in six."""
    pattern = m.get("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):
        return ["sliding_attention" if flag else "full_attention" for flag in pattern[:layers]]
    return ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention" for i in range(layers)]


def _gemma3(m: Metadata) -> dict[str, Any]:
    """Gemma 3's text model: local layers with their own rope base, global ones with the file's (and its scaling)."""
    config = _common(m)
    layers = config["num_hidden_layers"]
    window = m.get("attention.sliding_window")  # without one, llama.cpp runs every layer global
    config.update(model_type="gemma3_text", sliding_window=int(window or 4096),
                  layer_types=_gemma3_layers(m, layers) if window else ["full_attention"] * layers,
                  final_logit_softcapping=m.get("final_logit_softcapping"), attn_logit_softcapping=None,
                  query_pre_attn_scalar=_query_scalar(config, 62),
                  rope_parameters={"full_attention": _rope(m, config["head_dim"]),
                                   "sliding_attention": {"rope_type": "default",
                                                         "rope_theta": float(m.get("rope.freq_base_swa", 10000.0))}})
    return config


def _phi3(m: Metadata) -> dict[str, Any]:
    """Phi-3/Phi-4: a window on every layer, partial rotary, LongRoPE's factors stored as two tensors."""
    config = _common(m)
    rotary = int(m.get("rope.dimension_count", config["head_dim"]))
    rope = _rope(m, config["head_dim"])
    if m.has("rope_factors_long.weight"):
        original = int(m.get("rope.scaling.original_context_length", config["max_position_embeddings"]))
        rope = {"rope_type": "longrope", "rope_theta": rope["rope_theta"],
                "short_factor": m.tensor("rope_factors_short.weight"),
                "long_factor": m.tensor("rope_factors_long.weight"), "original_max_position_embeddings": original}
        config["original_max_position_embeddings"] = original
    rope["partial_rotary_factor"] = rotary / config["head_dim"]
    window = m.get("attention.sliding_window")
    config.update(model_type="phi3", rope_parameters=rope, sliding_window=int(window) if window else None)
    return config


def _gpt2(m: Metadata) -> dict[str, Any]:
    """GPT-2: its config spells sizes its own way."""
    common = _common(m)
    config = {"model_type": "gpt2", "n_embd": common["hidden_size"], "n_layer": common["num_hidden_layers"],
              "n_head": common["num_attention_heads"], "n_positions": common["max_position_embeddings"],
              "vocab_size": common["vocab_size"], "tie_word_embeddings": common["tie_word_embeddings"],
              "layer_norm_epsilon": float(m.get("attention.layer_norm_epsilon", 1e-5))}
    if m.has("blk.0.ffn_up.weight"):  # the converter states four times the width whatever the MLP's is
        config["n_inner"] = m.shapes["blk.0.ffn_up.weight"][0]
    config.update({k: v for k, v in common.items() if k.endswith("_token_id")})
    return config


#: llama.cpp's architecture name -> (the builder of its config, the transformers architecture it is).
ARCHITECTURES: dict[str, tuple[Callable[[Metadata], dict[str, Any]], dict[str, str]]] = {
    "llama": (_llama, {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                       "mixtral": "MixtralForCausalLM"}),
    "granite": (_granite, {"granite": "GraniteForCausalLM"}),
    "qwen2": (_decoder("qwen2"), {"qwen2": "Qwen2ForCausalLM"}),
    "qwen2moe": (_decoder("qwen2_moe"), {"qwen2_moe": "Qwen2MoeForCausalLM"}),
    "qwen3": (_decoder("qwen3"), {"qwen3": "Qwen3ForCausalLM"}),
    "qwen3moe": (_decoder("qwen3_moe"), {"qwen3_moe": "Qwen3MoeForCausalLM"}),
    "gemma": (_decoder("gemma"), {"gemma": "GemmaForCausalLM"}),
    "gemma2": (_gemma2, {"gemma2": "Gemma2ForCausalLM"}),
    "gemma3": (_gemma3, {"gemma3_text": "Gemma3ForCausalLM"}),
    "phi3": (_phi3, {"phi3": "Phi3ForCausalLM"}),
    "olmo2": (_decoder("olmo2"), {"olmo2": "Olmo2ForCausalLM"}),
    "gpt2": (_gpt2, {"gpt2": "GPT2LMHeadModel"}),
}


def gguf_config(path: str | Path) -> dict[str, Any]:
    """The transformers config (a ``config.json`` dict, ``architectures`` included) of the GGUF file at ``path``;
    an UnsupportedModelError naming the architecture for one no builder reads, a TruncatedGGUFError for a file
    cut short."""
    m = Metadata(read_gguf(path), Path(path))
    entry = ARCHITECTURES.get(m.arch)
    if entry is None:
        raise UnsupportedModelError(
            f"{Path(path).name} is a GGUF of llama.cpp architecture '{m.arch}', which no frame model family reads "
            f"(it reads GGUF files of {', '.join(sorted(ARCHITECTURES))}); serve the model's Hugging Face "
            f"checkpoint folder (config.json and *.safetensors) instead, which the transformers fallback family "
            f"may run.", param="model")
    build, architectures = entry
    config = build(m)
    config["architectures"] = [architectures[config["model_type"]]]
    config[MARKER] = MARKER_VERSION
    return config
