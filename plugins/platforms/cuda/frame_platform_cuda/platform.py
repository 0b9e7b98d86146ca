"""CudaPlatform: an NVIDIA GPU seen through a CUDA build of torch, its dtypes and its KV memory budget."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence

import torch
from frame.errors import ConfigError
from frame.interfaces.platform import Platform, rank_device_index
from pydantic import BaseModel, ConfigDict, Field

_GIB = 1 << 30
_MIB = 1 << 20

#: Block sizes the GPU kernels (the triton backend's tl.dot tiles) accept.
BLOCK_SIZES = (16, 32, 64, 128)


class CudaOptions(BaseModel):
    """Options of the ``cuda`` platform (``--platform-opt device_index=1``)."""

    model_config = ConfigDict(extra="forbid")

    device_index: int = Field(0, ge=0, description="which visible CUDA device to run on")
    reserve_mib: int = Field(512, ge=0, description="MiB of free memory kept out of the KV pool for activations")


def unavailable_reason() -> str | None:
    """None when torch is a CUDA build and sees a device; otherwise why not, in one sentence."""
    if torch.version.hip is not None:
        return f"torch {torch.__version__} is a ROCm build, so it drives AMD GPUs; use the rocm platform"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build, so no CUDA device is visible"
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but sees no CUDA device "
                "(check the NVIDIA driver and CUDA_VISIBLE_DEVICES)")
    return None


class CudaPlatform(Platform):
    """One NVIDIA GPU: float16 and float32 always, bfloat16 from compute capability 8.0 (Ampere) on."""

    name = "cuda"

    def __init__(self, options: CudaOptions | None = None) -> None:
        self.options = options or CudaOptions()
        self._graph_pool: tuple[int, int] | None = None
        self._graphs: list[torch.cuda.CUDAGraph] = []
        count = torch.cuda.device_count()
        if self.options.device_index >= count:
            raise ConfigError(
                f"device_index {self.options.device_index} is out of range: torch sees {count} CUDA device(s).",
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
        index = rank_device_index(self.options.device_index, rank, torch.cuda.device_count(), "CUDA device")
        self.options = self.options.model_copy(update={"device_index": index})

    @property
    def has_bf16(self) -> bool:
        return torch.cuda.get_device_capability(self.device)[0] >= 8

    @property
    def supported_dtypes(self) -> Sequence[torch.dtype]:
        return (torch.bfloat16, torch.float16, torch.float32) if self.has_bf16 else (torch.float16, torch.float32)

    @property
    def default_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.has_bf16 else torch.float16

    def describe(self) -> str:
        props = torch.cuda.get_device_properties(self.device)
        return (f"{props.name} ({props.total_memory / _GIB:.1f} GiB, compute capability {props.major}.{props.minor},"
                f" CUDA {torch.version.cuda})")

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
        """``triton`` when it and its package are installed, else ``sdpa``, else the first installed backend."""
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

    def capture_graph(self, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """Record ``fn`` as a CUDA graph (after warm-up runs on a side stream, as torch requires) sharing one memory
        pool with this platform's other recordings; the replay returns the graph's static output."""
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # lazy initialisation (cuBLAS handles, Triton autotuning) happens outside capture
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            output = fn()
        self._graphs.append(graph)  # a graph must outlive every replay of it

        def replay() -> torch.Tensor:
            graph.replay()
            return output

        return replay
