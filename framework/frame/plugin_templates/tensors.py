"""Templates of the kinds that run tensors: attention backend, platform, model family."""

from __future__ import annotations

from frame.plugin_templates.kind import KindTemplate

ATTENTION = KindTemplate(
    module="backend",
    plugin='''"""The {name} attention backend plugin: its hooks."""

from __future__ import annotations

import torch
from frame import hookimpl
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.platform import Platform
from pydantic import BaseModel

from {package}.backend import {class_name}

FRAME_API_VERSION = {api_version}


@hookimpl
def frame_attention_platforms() -> list[str]:
    """The platforms this backend runs on: plain torch runs wherever torch does."""
    return ["cpu", "cuda", "rocm"]


@hookimpl
def frame_attention_kv_dtypes() -> list[str]:
    """The --kv-cache-dtype values it reads: the float ones, and int8 / fp8 rows (codes and a scale)."""
    return ["float32", "bfloat16", "float16", "int8", "fp8"]


@hookimpl
def frame_attention_create(
    num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype, platform: Platform,
    options: BaseModel | None, sliding_window: int | None, logit_softcap: float | None,
) -> AttentionBackend:
    """One {class_name} per distinct attention spec of the model (window and soft-cap included)."""
    return {class_name}(num_heads, num_kv_heads, head_dim, scale, dtype, sliding_window, logit_softcap)
''',
    implementation='''"""{class_name}: paged attention in plain torch, one sequence at a time (a reference).

Each sequence's context is gathered from the paged pool through its block table and attended with explicit
scores, so a window and a soft-cap are one line each. Replace ``attend`` with your kernel and keep the tests green.
"""

from __future__ import annotations

import torch
from frame.interfaces.attention import AttentionBackend, AttentionMetadata
from frame.interfaces.kv_dtype import read_rows, write_rows


class {class_name}(AttentionBackend):
    """Writes K/V by slot; attends per sequence over the gathered context (causal, windowed, soft-capped)."""

    supports_sliding_window = True
    supports_logit_softcap = True

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        write_rows(k_cache, slot_mapping, key)  # converted to the pool's dtype; quantized for an int8 / fp8 pool
        write_rows(v_cache, slot_mapping, value)

    def attend(
        self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        out = torch.empty_like(query)
        keys = k_cache.view(-1, self.num_kv_heads, k_cache.shape[-1])  # head_dim, + 4 scale bytes when quantized
        values = v_cache.view(-1, self.num_kv_heads, v_cache.shape[-1])
        group = self.num_heads // self.num_kv_heads
        first = 0
        for seq, (new, total) in enumerate(zip(meta.query_lens, meta.seq_lens_host, strict=True)):
            pos = torch.arange(total, device=query.device)
            slots = meta.block_tables[seq].long()[pos // meta.block_size] * meta.block_size + pos % meta.block_size
            # [heads, total, dim], dequantized from an int8 / fp8 pool
            k = read_rows(keys[slots], torch.float32).transpose(0, 1).repeat_interleave(group, dim=0)
            v = read_rows(values[slots], torch.float32).transpose(0, 1).repeat_interleave(group, dim=0)
            q = query[first : first + new].transpose(0, 1).float()  # [heads, new, dim]
            scores = (q @ k.transpose(1, 2)) * self.scale
            if self.logit_softcap is not None:
                scores = self.logit_softcap * torch.tanh(scores / self.logit_softcap)
            at = pos[total - new :, None]  # each query's own position, after the cached context
            visible = pos[None, :] <= at
            if self.sliding_window is not None:
                visible &= pos[None, :] > at - self.sliding_window
            probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
            out[first : first + new] = (probs @ v).transpose(0, 1).to(query.dtype)
            first += new
        return out
''',
    tests='''"""frame's attention conformance suite, on the cpu platform, against this backend through its hooks."""

from frame.testing.attention import AttentionBackendSuite


class Test{class_name}(AttentionBackendSuite):
    plugin_name = "{name}"
''',
    test_requires=("frame-platform-cpu",),
    select="`frame generate --attn {name} --prompt \"Hello\"`, `attn: {name}` in a config file, or "
           "`LLM(attn=\"{name}\")`.",
    runs="On the platforms `frame_attention_platforms` lists (`frame plugins` says whether it can run here). As "
         "written it is plain torch, so it runs wherever torch does; a kernel of your own narrows that list.",
)

PLATFORM = KindTemplate(
    module="platform",
    plugin='''"""The {name} platform plugin: its hooks."""

from __future__ import annotations

from frame import hookimpl
from frame.interfaces.platform import Platform
from pydantic import BaseModel

from {package}.platform import {class_name}

FRAME_API_VERSION = {api_version}


@hookimpl
def frame_platform_check() -> str | None:
    """None when this machine has the device, else one sentence saying why not."""
    return {class_name}.unavailable_reason()


@hookimpl
def frame_platform_priority() -> int:
    """Below the cpu platform's 0, so ``--platform auto`` takes this one only when nothing else can run."""
    return -1


@hookimpl
def frame_platform_create(options: BaseModel | None) -> Platform:
    """The {class_name} for this run."""
    return {class_name}()
''',
    implementation='''"""{class_name}: the {name} platform, to start from: the host CPU with torch's own kernels.

Replace the device, the dtypes, the check and the KV budget with your accelerator's, and keep this class's tests
green.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from frame.errors import ConfigError
from frame.interfaces.platform import Platform

#: The KV pool never takes more than this, whatever the memory fraction allows.
_KV_CAP_BYTES = 1 << 30


class {class_name}(Platform):
    """float32 on the host CPU, no native kernels."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None: every machine has a CPU (an accelerator's platform says here what is missing)."""
        return None

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def supported_dtypes(self) -> Sequence[torch.dtype]:
        return (torch.float32,)

    def describe(self) -> str:
        return f"{name} ({{os.cpu_count()}} CPU cores, torch kernels)"

    def kv_cache_budget_bytes(self, memory_fraction: float, model_bytes: int) -> int:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        share = int(memory_fraction * ram) - model_bytes
        if share <= 0:
            raise ConfigError(f"kv_cache_fraction {{memory_fraction}} of RAM does not hold the weights; raise it.",
                              param="kv_cache_fraction")
        return min(share, _KV_CAP_BYTES)

    def preferred_attention(self, installed: Sequence[str]) -> str:
        if not installed:
            raise ConfigError("No attention backend is installed; install frame-attention-sdpa.", param="attn")
        return "sdpa" if "sdpa" in installed else sorted(installed)[0]
''',
    tests='''"""frame's platform conformance suite, run against this platform through its hooks."""

from frame.testing.platform import PlatformSuite


class Test{class_name}(PlatformSuite):
    plugin_name = "{name}"
''',
    test_requires=(),
    select="`frame generate --platform {name} --prompt \"Hello\"`, `platform: {name}` in a config file, or "
           "`LLM(platform=\"{name}\")`; `--platform auto` (the default) picks it when its check passes and its "
           "`frame_platform_priority` is the highest.",
    runs="Wherever `frame_platform_check` returns None (`frame plugins` shows its answer).",
)

MODEL = KindTemplate(
    module="model",
    plugin='''"""The {name} model family plugin: the shared family hooks over its args and model class.

``frame.layers.family.family_hooks`` answers the four model hooks from the family's config reader and model class
(see docs/models.md); a family whose hooks differ writes them as ``@hookimpl`` functions instead.
"""

from __future__ import annotations

from frame.layers.family import family_hooks

from {package}.model import ARCHITECTURES, {camel}Args, {class_name}

FRAME_API_VERSION = {api_version}

_hooks = family_hooks(ARCHITECTURES, {camel}Args.from_config, {class_name})
frame_model_architectures = _hooks.architectures
frame_plugin_options = _hooks.options
frame_model_attention = _hooks.attention
frame_model_create = _hooks.create
''',
    implementation='''"""{class_name}: a Llama-shaped decoder over paged KV, built from ``frame.layers``.

It builds a made-up architecture (``ARCHITECTURES`` below): pre-norm decoder layers of rotary self-attention and
a SwiGLU MLP, RMS norms, optionally tied embeddings, with Hugging Face's Llama tensor names and llama.cpp's (as its
converter writes a GGUF that keeps Hugging Face's row order). Rename the architecture to the one your checkpoints
declare and change what differs, layer by layer; the tests compare the logits with transformers'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from frame.interfaces.attention import AttentionBackend, AttentionSpec
from frame.layers import DecoderLM, GatedMLP, PreNormDecoderLayer, RMSNorm, RotaryEmbedding, SelfAttention
from frame.layers.config import DecoderArgs, architecture_of
from frame.weights.loading import Placement
from frame.weights.names import NameMap
from pydantic import BaseModel
from torch import nn
from transformers import PretrainedConfig

FAMILY = "{name}"
#: The Hugging Face architectures this family builds (a checkpoint's config.json ``architectures``).
ARCHITECTURES = ["{architecture}"]
#: Configs that name only a model type (GGUF-derived ones) map to an architecture here.
MODEL_TYPES = {{"{model_type}": "{architecture}"}}


@dataclass(frozen=True)
class {camel}Args(DecoderArgs):
    """The common decoder sizes (``DecoderArgs``) plus what this family reads besides: the MLP's activation."""

    hidden_act: str = "silu"

    @classmethod
    def from_config(cls, config: PretrainedConfig, options: BaseModel | None = None) -> {camel}Args:
        """Read ``config``; UnsupportedModelError naming the field for anything this family does not build."""
        architecture = architecture_of(config, MODEL_TYPES, FAMILY)
        return cls(**DecoderArgs.read(config, architecture, FAMILY, options), hidden_act=config.hidden_act)


class {class_name}(DecoderLM):
    """Embedding, pre-norm decoder layers, final norm and the (possibly tied) output projection."""

    def __init__(self, args: {camel}Args, attention: AttentionBackend, device: torch.device, dtype: torch.dtype,
                 layer_attention: list[AttentionBackend] | None = None) -> None:
        super().__init__(args.attention_specs(), attention, layer_attention, args.architecture)
        self.args = args
        self.names = {{False: NameMap.hf(args.num_layers, self.what), True: NameMap.gguf(args.num_layers, self.what)}}
        self.add_embeddings(args.vocab_size, args.hidden_size, args.tie_word_embeddings, device, dtype)
        self.rotary = RotaryEmbedding(args.rope, args.head_dim, args.max_position_embeddings, device)
        self.layers = nn.ModuleList(self._layer(spec, backend, device, dtype)
                                    for spec, backend in zip(self.specs, self.backends, strict=True))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps, device, dtype)

    def _layer(self, spec: AttentionSpec, backend: AttentionBackend, device: torch.device,
               dtype: torch.dtype) -> PreNormDecoderLayer:
        args = self.args
        return PreNormDecoderLayer(
            RMSNorm(args.hidden_size, args.norm_eps, device, dtype),
            SelfAttention(args.hidden_size, spec, backend, device, dtype),
            RMSNorm(args.hidden_size, args.norm_eps, device, dtype),
            GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act, False, device, dtype),
        )

    def placements(self, name: str, tensor: torch.Tensor, gguf: bool) -> list[Placement] | None:
        """Where checkpoint tensor ``name`` goes: Hugging Face's Llama names, or llama.cpp's in a GGUF."""
        return self.names[gguf].place(name, tensor)
''',
    tests='''"""frame's model-family conformance suite: this family's logits against transformers', tiny checkpoints.

The skeleton's architecture is made up, so transformers learns it here: a Llama under that name (and its own
model type) is the reference the suite compares with. When the family builds a real architecture, delete the
registration and keep ``tiny_config`` only if its config spells sizes otherwise.
"""

from frame.testing.model import TINY, ModelFamilySuite
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PretrainedConfig

from {package}.model import ARCHITECTURES


class {camel}Config(LlamaConfig):
    model_type = "{model_type}"


class {architecture}(LlamaForCausalLM):
    config_class = {camel}Config


AutoConfig.register("{model_type}", {camel}Config, exist_ok=True)
AutoModelForCausalLM.register({camel}Config, {architecture}, exist_ok=True)


class Test{class_name}(ModelFamilySuite):
    plugin_name = "{name}"

    def tiny_config(self, architecture: str, **overrides) -> PretrainedConfig:
        return {camel}Config(architectures=[architecture], **{{**TINY, **overrides}})

    #: llama.cpp has no name for a new architecture: the check writes the weights in QWEN2's layout and reads them
    #: back with this family on the checkpoint's own config (a file that says QWEN2 is the qwen family's to serve).
    gguf_config_from_file = False

    def gguf_architecture(self, architecture: str) -> str | None:
        """llama.cpp's layout for the GGUF check: QWEN2's names and Hugging Face's row order, which this family
        reads (LLAMA's converter interleaves Q/K rows, which a family then un-permutes)."""
        return "QWEN2"

    def extra_configs(self) -> dict[str, PretrainedConfig]:
        return {{"tied-multi-query": self.tiny_config(ARCHITECTURES[0], tie_word_embeddings=True,
                                                      num_key_value_heads=1)}}
''',
    test_requires=("frame-platform-cpu", "frame-attention-sdpa"),
    select="No flag: frame builds a checkpoint with the family whose `frame_model_architectures` lists the "
           "checkpoint's `architectures`, so `frame generate --model /path/to/checkpoint --prompt \"Hello\"` or "
           "`LLM(model=\"/path/to/checkpoint\")` uses it once it lists them.",
    runs="On every platform that has an attention backend (the family calls the backend it is given).",
)
