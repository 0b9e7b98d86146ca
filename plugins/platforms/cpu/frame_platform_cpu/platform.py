"""CpuPlatform: the host CPU, its threads, its dtypes and the memory the KV pool may take."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from frame import native
from frame.errors import ConfigError
from frame.interfaces.platform import Platform
from frame.layers import (
    ActAndMul,
    HeadNorm,
    Linear,
    ParallelLMHead,
    RMSNorm,
    RotateHalves,
    SiluAndMul,
    SwiGLUProjection,
    UpcastRMSNorm,
    packed_weight,
)
from frame.layers.activation import gelu_tanh
from pydantic import BaseModel, ConfigDict, Field

from frame_platform_cpu import huge_pages, kernels, kquant, probe, quantized, rows, w8a8
from frame_platform_cpu.graphs import RecordedStep

_GIB = 1 << 30
#: The share of the memory available at start that the KV pool takes unless ``--kv-cache-memory`` sizes it: like
#: vLLM-CPU's ``VLLM_CPU_KVCACHE_SPACE``, a space set aside for KV beside the weights, here sized from what the
#: machine has free rather than a fixed 4 GiB (half: the other half is left to the activations, the tokenizer,
#: the API server and whatever else runs on the host).
KV_SHARE_OF_AVAILABLE = 0.5


class CpuOptions(BaseModel):
    """Options of the ``cpu`` platform (``--platform-opt threads=4``)."""

    model_config = ConfigDict(extra="forbid")
    #: Options this platform took once, and what replaced them (the core's refusal of the old key says so).
    replaced_keys: ClassVar[dict[str, str]] = {
        "kv_cache_gib": "--kv-cache-memory (config key kv_cache_memory, a byte size such as 4GiB)"}

    threads: int | None = Field(None, ge=1, description="torch intra-op threads; default: every usable core")
    native_kernels: bool = Field(
        True, description="use the platform's kernels for bfloat16 layers (linears on packed weights, fused norm, "
                    "activation and rotary)"
    )
    decode_graphs: bool = Field(
        True, description="record each decode batch size's step once and replay it as a native program, without "
                    "Python per layer (also off with --enforce-eager / --no-cuda-graphs)"
    )
    step_teams: bool = Field(
        True, description="run each stretch of the platform's own calls in a replayed decode step in one parallel "
                    "region, the threads meeting at spin barriers (off: every kernel opens its own OpenMP region)"
    )
    huge_pages: bool = Field(
        True, description="put the packed weights and the KV pool on transparent huge pages where Linux offers "
                    "them (a decode step streams both; 4 KiB pages cost it TLB walks)"
    )


class CpuPlatform(Platform):
    """Runs everything on the CPU with torch; float32 always, bfloat16 (the default) where the CPU has it natively."""

    name = "cpu"

    def __init__(self, options: CpuOptions | None = None) -> None:
        """Raises ConfigError when ``FRAME_CPU_DISABLE`` names a flag frame does not know (``amx`` for
        ``amx_tile``): read here, at the start, rather than first deep inside a probe or a kernel's build."""
        native.disabled_cpu_flags()
        self.options = options or CpuOptions()
        self._ranks_sharing = 1

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """A CPU is always there."""
        return None

    @property
    def threads(self) -> int:
        """The ``threads`` option, or this process's share of the usable cores (all of them without tensor
        parallelism; with it, the ranks on this host split them)."""
        return self.options.threads or max(1, probe.usable_cores() // self._ranks_sharing)

    def for_rank(self, rank: int, world_size: int) -> None:
        """Tensor-parallel ranks on one host share its cores instead of each spinning on all of them."""
        self._ranks_sharing = world_size

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def supported_dtypes(self) -> Sequence[torch.dtype]:
        """float32 always; bfloat16 where the CPU computes it (AVX-512 BF16, AMX, Arm BF16) or stores it and
        computes in float32 with vector instructions of its own (AVX2 and FMA, AVX-512, Arm NEON)."""
        return (torch.float32, torch.bfloat16) if probe.bf16_path() is not None else (torch.float32,)

    @property
    def default_dtype(self) -> torch.dtype:
        # Measured on a 2-core AVX-512 BF16 machine (no AMX), torch 2.13, SmolLM2-135M's linear shapes: bfloat16
        # matmuls run 2-3x faster than float32 from 64 rows up, and bfloat16 halves the KV bytes attention reads.
        # AVX-512 without BF16 (FRAME_CPU_DISABLE=avx512_bf16 on a Zen 4): bfloat16 storage ran the mixed batch
        # 1.10-1.17x float32 (half the bytes of weights and KV, the same float32 FMAs); on AVX2 alone it did not
        # pay (1.00x, measured the same way on the same machine, and on a Zen 3), so float32 stays there.
        if probe.has_fast_bf16() or probe.bf16_path() == "avx512":
            return torch.bfloat16
        return torch.float32

    def describe(self) -> str:
        features = [torch.backends.cpu.get_cpu_capability()]
        if probe.has_amx():
            features.append("AMX BF16")
        elif probe.has_bf16():
            features.append("BF16")
        if disabled := os.environ.get(native.DISABLE_ENV, "").strip():
            features.append(f"{native.DISABLE_ENV}={disabled}")
        if self.options.huge_pages and huge_pages.available():
            features.append("huge pages")
        return f"CPU ({self.threads} threads, {', '.join(features)})"

    def kernel_paths(self) -> dict[str, str]:
        """The ISA path of each dtype's linears and of each packed format's kernel on this CPU."""
        if not self.options.native_kernels or kernels.unavailable_reason() is not None:
            return {}
        paths: dict[str, str] = {}
        if probe.has_avx2_fma():
            paths["float32"] = f"{'avx512' if 'avx512f' in probe.cpu_flags() else 'avx2'} packed linear"
        bf16 = probe.bf16_path()
        if bf16 == "avx512_bf16":
            paths["bfloat16"] = ("amx packed linear (AMX BF16 tiles)" if kernels.amx_usable()
                                 else "avx512_bf16 packed linear")
        elif bf16 in probe.STORAGE_PATHS:
            paths["bfloat16"] = f"{bf16} packed linear (bfloat16 storage, float32 arithmetic)"
        elif bf16 is not None:
            paths["bfloat16"] = f"{bf16} (torch)"
        for fmt in quantized.served_formats():
            paths[fmt] = kquant.isa_path() if fmt in kquant.KQUANT_FORMATS else quantized.isa_path()
        if "int8" in paths:
            vnni = w8a8.isa_path()
            scheme = f"{vnni} (W8A8: x int8 per token" if vnni else f"{paths['int8']} (W8A8: x int8 per block of 32"
            paths["int8"] = scheme + "; weight-only int8 is dequantised)"
        return paths

    def kv_cache_budget_bytes(self, memory_fraction: float, model_bytes: int) -> int:
        """Half of the memory available now (the weights already loaded), at most ``memory_fraction`` of RAM less
        the weights."""
        share = int(memory_fraction * probe.total_memory_bytes()) - model_bytes
        if share <= 0:
            raise ConfigError(
                f"kv_cache_fraction {memory_fraction} of this machine's RAM does not even hold the "
                f"{model_bytes / _GIB:.1f} GiB of weights; raise kv_cache_fraction or use a smaller model.",
                param="kv_cache_fraction",
            )
        return min(share, int(KV_SHARE_OF_AVAILABLE * probe.available_memory_bytes()))

    def preferred_attention(self, installed: Sequence[str]) -> str:
        """``cpu_paged`` (the native kernel), else ``sdpa`` (plain torch), else the first installed backend."""
        for name in ("cpu_paged", "sdpa"):
            if name in installed:
                return name
        if not installed:
            raise ConfigError("No attention backend is installed; install frame-attention-sdpa.", param="attn")
        return sorted(installed)[0]

    def layer_kernel(self, layer: torch.nn.Module) -> Callable[..., Any] | None:
        """Linears whose weight a quantization plugin keeps packed: the format's kernel (``quantized.py``); a lookup
        table kept packed (a GGUF's token embedding): its rows for the ids, in one native op (``rows.py``).
        float32 linears on CPUs with AVX2 and FMA: the packed float32 kernel.
        bfloat16 models: linears on weights packed once (AVX-512 BF16 dot products where the CPU has them, else
        float32 arithmetic on bfloat16 weights with AVX2, else oneDNN), SwiGLU's projection with the activation
        in the matmul's epilogue (or right after it). bfloat16 and float32 models: the fused residual-add norm, SwiGLU
        activation and rotary."""
        with huge_pages.placing(self.options.huge_pages):  # what the kernel packs, onto huge pages
            return self._layer_kernel(layer)

    def _layer_kernel(self, layer: torch.nn.Module) -> Callable[..., Any] | None:
        if not self.options.native_kernels or kernels.unavailable_reason() is not None:
            return None
        packed = packed_weight(layer)
        if getattr(layer, "reads_packed_rows", False):  # a lookup table: dense ones keep F.embedding
            table = layer.weight
            return rows.packed_rows(packed, table.dtype) if packed is not None and table.device.type == "meta" else None
        if packed is not None:  # a quantization plugin's format: ggml blocks in place
            return quantized.packed_layer_kernel(layer, packed, gated=isinstance(layer, SwiGLUProjection))
        if (kernel := self._float32_compute_kernel(layer)) is not None:
            return kernel
        weight = getattr(layer, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dtype == torch.float32:
            return self._float32_kernel(layer)
        if probe.bf16_path() is None:
            return None
        if isinstance(layer, Linear):  # SwiGLUProjection too
            return self._bfloat16_linear(layer) if layer.weight.dtype == torch.bfloat16 else None
        if isinstance(layer, RMSNorm):
            return kernels.fused_add_rms_norm(layer.weight, layer.eps) if layer.weight.dtype == torch.bfloat16 else None
        if isinstance(layer, SiluAndMul):
            return kernels.fused_silu_and_mul()
        if isinstance(layer, RotateHalves):
            return kernels.fused_rotate_halves()
        return None

    @staticmethod
    def _bfloat16_linear(layer: Linear) -> Callable[..., Any] | None:
        """A bfloat16 linear (or SwiGLU projection) on this CPU's bfloat16 path (``probe.bf16_path``)."""
        gated = isinstance(layer, SwiGLUProjection)
        path = probe.bf16_path()
        if path == "avx512_bf16":
            if gated:
                return kernels.bfloat16_swiglu_projection(layer.weight, layer.bias)
            return kernels.bfloat16_linear(layer.weight, layer.bias, float_output=isinstance(layer, ParallelLMHead))
        if path in probe.STORAGE_PATHS:  # storage only: float32 arithmetic on the bfloat16 weights
            if gated:
                return kernels.float32_swiglu_projection(layer.weight, layer.bias)
            return kernels.float32_linear(layer.weight, layer.bias)
        if not gated and torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return kernels.bfloat16_linear(layer.weight, layer.bias)  # oneDNN on prepacked weights
        return None

    @staticmethod
    def _float32_compute_kernel(layer: torch.nn.Module) -> Callable[..., Any] | None:
        """Layers that compute in float32 for bfloat16 and float32 models alike: the norms Gemma and OLMo 2 weight in
        float32, per-head query and key norms (Gemma 3, Qwen 3) and GeGLU's activation (Gemma)."""
        if isinstance(layer, UpcastRMSNorm):
            return kernels.fused_rms_norm(layer.weight, layer.eps, layer.offset)
        if isinstance(layer, HeadNorm) and layer.per_head:
            return kernels.fused_head_rms_norm(layer.weight, layer.eps, layer.offset, layer.upcast)
        if isinstance(layer, ActAndMul) and layer.fn is gelu_tanh:
            return kernels.fused_gelu_tanh_and_mul()
        return None

    @staticmethod
    def _float32_kernel(layer: torch.nn.Module) -> Callable[..., Any] | None:
        """float32 layers: the packed AVX2 linear (SwiGLU's activation after it) and the fused residual-add norm
        (the SwiGLU activation and rotary are asked for as for every dtype)."""
        if isinstance(layer, SwiGLUProjection):
            return kernels.float32_swiglu_projection(layer.weight, layer.bias)
        if isinstance(layer, Linear):
            return kernels.float32_linear(layer.weight, layer.bias)
        if isinstance(layer, RMSNorm):
            return kernels.fused_add_rms_norm(layer.weight, layer.eps)
        return None

    def greedy_kernel(self) -> Callable[[torch.Tensor, torch.Tensor], None] | None:
        """The native row argmax (``csrc/row_argmax.cpp``), unless ``native_kernels=false`` or the kernels cannot
        build here."""
        if not self.options.native_kernels or kernels.unavailable_reason() is not None:
            return None
        return kernels.greedy_tokens()

    def capture_graph(self, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor] | None:
        """A recording of the decode step ``fn`` replayed as a native program (``graphs.py``), made on
        the replay's first call; None with ``decode_graphs=false``."""
        return RecordedStep(fn, teams=self.options.step_teams) if self.options.decode_graphs else None

    def place_kv_pool(self, pool: torch.Tensor) -> None:
        """Ask Linux for transparent huge pages under the pool (``huge_pages.py``), unless ``huge_pages=false``."""
        if self.options.huge_pages:
            huge_pages.advise(pool)

    def set_up(self) -> None:
        """Set torch's intra-op thread count."""
        torch.set_num_threads(self.threads)
