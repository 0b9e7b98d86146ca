"""Writing a Hugging Face checkpoint as a llama.cpp GGUF file, for model families' GGUF tests.

Names come from gguf-py's own table (``gguf.get_tensor_name_map``, the one llama.cpp's converter uses), so a family's
GGUF names are checked against llama.cpp's rather than against themselves. Experts saved one tensor each
(``...experts.3.gate_proj``) are stacked into llama.cpp's ``ffn_*_exps`` tensors. What llama.cpp's converter does to
an architecture's values (Llama's Q/K row interleaving, Gemma's ``+ 1`` on norms, GPT-2's transposed Conv1D weights)
is the caller's ``convert``; :func:`llama_cpp_permute` is the first of those.

With a config, :func:`write_gguf` also writes the metadata llama.cpp's converter writes for every text model
(:func:`write_text_model_keys`; an architecture's own keys are the caller's ``metadata``) and a tiny byte-level
tokenizer with special tokens and a chat template (:func:`write_tiny_tokenizer`), so frame reads the whole file the
way it reads a real one. ``file_type`` is what the converter's ``--outtype`` does to the tensors: ``f32``; ``f16``
(2-D weights in float16); ``q8_0`` (2-D weights in ggml's q8_0 blocks, float16 where a row is not whole blocks);
vectors, the MoE router and learned positions stay float32. :func:`as_stored` gives a tensor's values as the file
holds them, for the transformers reference.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize
from transformers import PretrainedConfig

from frame.interfaces.model import WeightSource

_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(.+)$")


class NoLlamaCppName(ValueError):
    """llama.cpp's architecture has no name for a tensor of the checkpoint (a variant llama.cpp does not run)."""


def llama_cpp_permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """What llama.cpp's converter does to Llama's Q/K rows: each head's two rotary halves interleaved."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, half, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def _stacked(source: WeightSource) -> dict[str, torch.Tensor]:
    """Every tensor by name, per-expert tensors stacked under the expert-less name (``...experts.gate_proj``)."""
    tensors: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in source.tensors():
        match = _EXPERT.match(name)
        if match is None:
            tensors[name] = tensor
        else:
            experts.setdefault(f"{match.group(1)}.{match.group(3)}", {})[int(match.group(2))] = tensor
    for name, by_index in experts.items():
        tensors[name] = torch.stack([by_index[i] for i in sorted(by_index)])
    return tensors


def _kept_float32(name: str, tensor: torch.Tensor) -> bool:
    """Tensors the converter writes in float32 whatever the outtype: vectors, the MoE routers, learned positions."""
    return tensor.dim() < 2 or any(part in name for part in ("ffn_gate_inp", "position_embd", "rope_"))


def stored(name: str, tensor: torch.Tensor, file_type: str) -> tuple[np.ndarray, GGMLQuantizationType | None]:
    """``tensor`` (llama.cpp name ``name``) as a file of ``file_type`` stores it: an array and its ggml type."""
    array = np.ascontiguousarray(tensor.float().numpy())
    if file_type == "f32" or _kept_float32(name, tensor):
        return array, None
    if file_type == "q8_0" and tensor.shape[-1] % GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0][0] == 0:
        return quantize(array, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0
    return array.astype(np.float16), None


#: Hugging Face names of the tensors :func:`stored` keeps float32 (routers, shared-expert gates, learned positions).
HF_KEPT_FLOAT32 = re.compile(r"(\.gate|shared_expert_gate|\.wpe)\.weight$")


def as_stored(tensor: torch.Tensor, file_type: str, hf_name: str = "") -> torch.Tensor:
    """The values a file of ``file_type`` holds for ``tensor`` (Hugging Face name ``hf_name``, laid out as the file
    lays it out): what transformers must compute with for its logits to be the file's."""
    if HF_KEPT_FLOAT32.search(hf_name):
        return tensor.float()
    array, qtype = stored("", tensor, file_type)
    values = dequantize(array, qtype) if qtype is not None else array
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(tensor.shape)


def _get(config: PretrainedConfig, *keys: str) -> Any:
    return next((getattr(config, k) for k in keys if getattr(config, k, None) is not None), None)


def write_text_model_keys(writer: gguf.GGUFWriter, config: PretrainedConfig, file_type: str) -> None:
    """What llama.cpp's converter writes for every text model (its ``TextModel.set_gguf_parameters``)."""
    writer.add_block_count(_get(config, "num_hidden_layers", "n_layer"))
    if (n_ctx := _get(config, "max_position_embeddings", "n_ctx", "n_positions")) is not None:
        writer.add_context_length(n_ctx)
    writer.add_embedding_length(_get(config, "hidden_size", "n_embd"))
    if (n_ff := _get(config, "intermediate_size", "n_inner")) is not None:
        writer.add_feed_forward_length(n_ff)
    writer.add_head_count(_get(config, "num_attention_heads", "n_head"))
    if (n_kv := getattr(config, "num_key_value_heads", None)) is not None:
        writer.add_head_count_kv(n_kv)
    rope = getattr(config, "rope_parameters", None) or {}
    if (theta := rope.get("rope_theta")) is not None:
        writer.add_rope_freq_base(theta)
    if (eps := getattr(config, "rms_norm_eps", None)) is not None:
        writer.add_layer_norm_rms_eps(eps)
    if (eps := getattr(config, "layer_norm_epsilon", None)) is not None:
        writer.add_layer_norm_eps(eps)
    if (experts := _get(config, "num_local_experts", "num_experts")) is not None:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
    if (head_dim := getattr(config, "head_dim", None)) is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                          "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[file_type])


#: The tiny tokenizer's special tokens; its other tokens are single printable bytes (GPT-2's byte alphabet).
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
CHAT_TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}:{{ m['content'] }}</s>{% endfor %}"


def write_tiny_tokenizer(writer: gguf.GGUFWriter, vocab_size: int, pad: bool = False) -> list[str]:
    """A byte-level BPE vocabulary of at most ``vocab_size`` tokens (one merge, ``a b``; else one token a character),
    its special tokens (pad 0, bos 1, eos 2) and :data:`CHAT_TEMPLATE`, as the converter writes a GPT-2-style
    tokenizer; ``pad``: filled to ``vocab_size`` with ``<unusedN>`` tokens, as a real model's large vocabulary is
    (llama.cpp's tokenizer then holds as many rows as the embedding). Returns the tokens."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = [bytes_to_unicode()[b] for b in (32, *range(ord("a"), ord("z") + 1), *range(33, 127))]
    tokens = [*SPECIAL_TOKENS, "ab", *dict.fromkeys(alphabet)][:vocab_size]
    if pad:
        tokens += [f"<unused{i}>" for i in range(vocab_size - len(tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS)
                           + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIAL_TOKENS)))
    writer.add_token_merges(["a b"])
    writer.add_pad_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    return tokens


def write_gguf(source: WeightSource, path: Path, architecture: str, num_layers: int,
               convert: Callable[[str, torch.Tensor], torch.Tensor] | None = None, *,
               config: PretrainedConfig | None = None, file_type: str = "f32",
               metadata: Callable[[gguf.GGUFWriter], None] | None = None, pad_vocab: bool = False) -> None:
    """Write ``source`` (Hugging Face names) to ``path`` as llama.cpp architecture ``architecture`` (a
    ``gguf.MODEL_ARCH`` member name such as ``"QWEN3"``); ``convert(hf_name, tensor)`` first. With ``config``,
    the converter's common keys, the tiny tokenizer and then ``metadata(writer)`` (the architecture's own keys and
    extra tensors) go in too; ``pad_vocab``: the tokenizer filled to the config's vocabulary
    (:func:`write_tiny_tokenizer`)."""
    arch = gguf.MODEL_ARCH[architecture]
    names = gguf.get_tensor_name_map(arch, num_layers)
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    if config is not None:
        write_text_model_keys(writer, config, file_type)
        write_tiny_tokenizer(writer, _get(config, "vocab_size"), pad=pad_vocab)
        if metadata is not None:
            metadata(writer)
    for name, tensor in _stacked(source).items():
        stem, _, kind = name.rpartition(".")
        mapped = names.get_name(stem)
        if mapped is None:
            raise NoLlamaCppName(f"llama.cpp has no {architecture} name for {name!r}")
        value = convert(name, tensor) if convert is not None else tensor
        if value.dim() == 2 and value.shape[0] == 1:
            value = value[0]  # ggml counts no trailing size-1 dimension: llama.cpp's files hold a one-row matrix flat
        array, qtype = stored(f"{mapped}.{kind}", value, file_type)
        writer.add_tensor(f"{mapped}.{kind}", array, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def int8_block_rounded(x: torch.Tensor) -> torch.Tensor:
    """``x`` as llama.cpp's integer kernels see it: each block of 32 along the last dimension rounded to int8
    steps of its ``max|x| / 127`` (the scale kept in float16, as llama.cpp's q8_0 blocks keep it), back in ``x``'s
    dtype."""
    blocks = x.float().reshape(*x.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = (amax / 127).half().float()
    inverse = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    return (torch.round(blocks * inverse) * scale).reshape(x.shape).to(x.dtype)


def int8_activation_logits(reference: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """``reference``'s float32 logits for ``ids`` with every linear's input rounded as :func:`int8_block_rounded`
    (where the input is whole blocks of 32): what a platform's packed kernels that round activations to 8 bits, as
    llama.cpp's do, compute, up to float32 sums. A small model with sharp attention (Gemma 3's query/key norms)
    can turn that rounding's half a percent at each matrix into well over 5% of its logits."""
    hooks = [module.register_forward_pre_hook(lambda _, args: (int8_block_rounded(args[0]), *args[1:]))
             for module in reference.modules()
             if isinstance(module, torch.nn.Linear) and module.in_features % 32 == 0]
    try:
        with torch.no_grad():
            return reference(torch.tensor([ids])).logits[0].float()
    finally:
        for hook in hooks:
            hook.remove()
