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
    """The platforms this backend runs on."""
    return ["cpu", "cuda", "rocm"]


@hookimpl
def frame_attention_create(
    num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype, platform: Platform,
    options: BaseModel | None,
) -> AttentionBackend:
    """One {class_name} serving every attention layer of the model."""
    return {class_name}(num_heads, num_kv_heads, head_dim, scale, dtype)
''',
    implementation='''"""{class_name}: the {name} attention backend."""

from __future__ import annotations

import torch
from frame.interfaces.attention import AttentionBackend, AttentionMetadata


class {class_name}(AttentionBackend):
    """Fill in write_kv and attend as frame.interfaces.attention.AttentionBackend describes."""

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        raise NotImplementedError("store key/value at slot_mapping (see AttentionBackend.write_kv)")

    def attend(
        self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        raise NotImplementedError("attention over the cached KV (see AttentionBackend.attend)")
''',
    tests='''"""frame's attention conformance suite, run on the cpu platform against this backend through its hooks."""

from frame.testing.attention import AttentionBackendSuite


class Test{class_name}(AttentionBackendSuite):
    plugin_name = "{name}"
''',
    test_requires=("frame-platform-cpu",),
    select="`frame generate --attn {name} --prompt \"Hello\"`, `attn: {name}` in a config file, or "
           "`LLM(attn=\"{name}\")`.",
    runs="On the platforms `frame_attention_platforms` lists (`frame plugins` says whether it can run here).",
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
def frame_platform_create(options: BaseModel | None) -> Platform:
    """The {class_name} for this run."""
    return {class_name}()
''',
    implementation='''"""{class_name}: the {name} platform."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from frame.interfaces.platform import Platform


class {class_name}(Platform):
    """Fill in each member as frame.interfaces.platform.Platform describes."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return "this platform is not implemented yet"

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    @property
    def supported_dtypes(self) -> Sequence[torch.dtype]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def kv_cache_budget_bytes(self, memory_fraction: float, model_bytes: int) -> int:
        raise NotImplementedError

    def preferred_attention(self, installed: Sequence[str]) -> str:
        raise NotImplementedError
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
    plugin='''"""The {name} model family plugin: its hooks."""

from __future__ import annotations

import torch
from frame import hookimpl
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.model import CausalLM
from transformers import PretrainedConfig

from {package}.model import {class_name}

FRAME_API_VERSION = {api_version}


@hookimpl
def frame_model_architectures() -> list[str]:
    """The Hugging Face architecture names this family builds, e.g. "MyModelForCausalLM"."""
    return []


@hookimpl
def frame_model_create(
    hf_config: PretrainedConfig, dtype: torch.dtype, device: torch.device, attention: AttentionBackend
) -> CausalLM:
    """The network for ``hf_config``, its weights not yet loaded."""
    return {class_name}(hf_config, attention).to(device=device, dtype=dtype)
''',
    implementation='''"""{class_name}: the {name} model family's network."""

from __future__ import annotations

import torch
from frame.interfaces.attention import AttentionBackend, AttentionMetadata
from frame.interfaces.model import CausalLM, KVCacheSpec, WeightSource
from transformers import PretrainedConfig


class {class_name}(CausalLM):
    """Fill in each member as frame.interfaces.model.CausalLM describes."""

    def __init__(self, hf_config: PretrainedConfig, attention: AttentionBackend) -> None:
        super().__init__()
        self.hf_config = hf_config
        self.attention = attention

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        raise NotImplementedError("layers, KV heads and head size of the model's attention")

    def load_weights(self, source: WeightSource) -> None:
        raise NotImplementedError("copy every tensor of source into the parameters")

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        raise NotImplementedError("hidden states of the flat batch; every attention layer calls self.attention")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
''',
    tests='''"""frame's model-family conformance suite: this family's logits against transformers', tiny checkpoints."""

from frame.testing.model import ModelFamilySuite


class Test{class_name}(ModelFamilySuite):
    plugin_name = "{name}"
''',
    test_requires=("frame-platform-cpu", "frame-attention-sdpa"),
    select="No flag: frame builds a checkpoint with the family whose `frame_model_architectures` lists the "
           "checkpoint's `architectures`, so `frame generate --model /path/to/checkpoint --prompt \"Hello\"` or "
           "`LLM(model=\"/path/to/checkpoint\")` uses it once it lists them.",
    runs="On every platform that has an attention backend (the family calls the backend it is given).",
)
