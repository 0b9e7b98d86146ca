"""RocmPlatform: an AMD GPU seen through a ROCm (HIP) build of torch, its dtypes and its KV memory budget.

ROCm builds of torch answer the ``torch.cuda`` API (device ``cuda:N`` is the N-th visible AMD GPU) and set
``torch.version.hip``; that attribute is what tells them from CUDA builds.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence

import torch
from frame.errors import ConfigError
from frame.interfaces.platform import Platform, rank_device_index
from pydantic import BaseModel, ConfigDict, Field

_GIB = 1 << 30
_MIB = 1 << 20

#: Block sizes the GPU kernels (triton's tl.dot tiles, AITER's paged attention) accept.
BLOCK_SIZES = (16, 32)


class RocmOptions(BaseModel):
    """Options of the ``rocm`` platform (``--platform-opt device_index=1``)."""

    model_config = ConfigDict(extra="forbid")

    device_index: int = Field(0, ge=0, description="which visible AMD GPU to run on")
    reserve_mib: int = Field(512, ge=0, description="MiB of free memory kept out of the KV pool for activations")


def unavailable_reason() -> str | None:
    """None when torch is a ROCm build and sees a device; otherwise why not, in one sentence."""
    if torch.version.hip is None:
        if torch.version.cuda is not None:
            return f"torch {torch.__version__} is a CUDA build, so it drives NVIDIA GPUs; use the cuda platform"
        return f"torch {torch.__version__} is a CPU-only build, so no ROCm device is visible"
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} is built for ROCm {torch.version.hip} but sees no AMD GPU "
                "(check access to /dev/kfd and /dev/dri, and HIP_VISIBLE_DEVICES)")
    return None


def aiter_imports() -> bool:
    """Whether AMD's AITER kernel library imports here (it is only ever installed on ROCm machines)."""
    if importlib.util.find_spec("aiter") is None:
        return False
    try:
        importlib.import_module("aiter")
    except Exception:  # a broken AITER build must not stop frame; the backend's own check names the cause
        return False
    return True


class RocmPlatform(Platform):
    """One AMD Instinct or Radeon GPU: float16, bfloat16 and float32."""

    name = "rocm"

    def __init__(self, options: RocmOptions | None = None) -> None:
        self.options = options or RocmOptions()
        count = torch.cuda.device_count()
        if self.options.device_index >= count:
            raise ConfigError(
                f"device_index {self.options.device_index} is out of range: torch sees {count} AMD GPU(s).",
                param="platform_options",
            )

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return unavailable_reason()

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.options.device_index)

    @property
    def distributed_backend(self) -> str:
        """NCCL (RCCL on ROCm builds of torch, under the same name)."""
        return "nccl"

    def for_rank(self, rank: int, world_size: int) -> None:
        """Rank ``r`` runs on device ``device_index + r``."""
        index = rank_device_index(self.options.device_index, rank, torch.cuda.device_count(), "AMD GPU")
        self.options = self.options.model_copy(update={"device_index": index})

    @property
    def supported_dtypes(self) -> Sequence[torch.dtype]:
        return (torch.bfloat16, torch.float16, torch.float32)

    @property
    def default_dtype(self) -> torch.dtype:
        return torch.bfloat16

    def describe(self) -> str:
        props = torch.cuda.get_device_properties(self.device)
        arch = getattr(props, "gcnArchName", "unknown arch").split(":")[0]
        return f"{props.name} ({props.total_memory / _GIB:.1f} GiB, {arch}, ROCm {torch.version.hip})"

    def kv_cache_budget_bytes(self, memory_fraction: float, model_bytes: int) -> int:
        """``memory_fraction`` of the device's free memory, less the weights and ``reserve_mib``."""
        free, _total = torch.cuda.mem_get_info(self.device)
        budget = int(memory_fraction * free) - model_bytes - self.options.reserve_mib * _MIB
        if budget <= 0:
            raise ConfigError(
                f"kv_cache_fraction {memory_fraction} of the {free / _GIB:.1f} GiB free on {self.device} does not "
                f"hold the {model_bytes / _GIB:.2f} GiB of weights and {self.options.reserve_mib} MiB reserve; raise "
                "kv_cache_fraction, lower reserve_mib or use a smaller model.",
                param="kv_cache_fraction",
            )
        return budget

    def preferred_attention(self, installed: Sequence[str]) -> str:
        """``rocm_aiter`` when installed and AITER imports, else ``triton``, else ``sdpa``, else the first one."""
        if "rocm_aiter" in installed and aiter_imports():
            return "rocm_aiter"
        if "triton" in installed and importlib.util.find_spec("triton") is not None:
            return "triton"
        if "sdpa" in installed:
            return "sdpa"
        if not installed:
            raise ConfigError("No attention backend is installed; install frame-attention-triton.", param="attn")
        return installed[0]

    def supported_block_sizes(self) -> Sequence[int]:
        return BLOCK_SIZES

    def set_up(self) -> None:
        torch.cuda.set_device(self.device)
