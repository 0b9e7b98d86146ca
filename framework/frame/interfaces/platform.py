"""Platform: the device frame runs on (CPU, a CUDA GPU, a ROCm GPU), its limits and its preferences."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch


class Platform(ABC):
    """A device kind: how to detect it, what it supports, how much KV it may hold.

    Created by the platform plugin's ``frame_platform_create`` hook only when :meth:`unavailable_reason`
    (a class-level check, no device state needed) returned None.
    """

    #: The plugin name (``cpu``, ``cuda``, ...), used in messages.
    name: str = ""

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """None when this machine has the device; otherwise one sentence saying why not."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """The torch device tensors are placed on."""

    @property
    @abstractmethod
    def supported_dtypes(self) -> Sequence[torch.dtype]:
        """Model and KV dtypes this platform computes in."""

    @abstractmethod
    def describe(self) -> str:
        """A short description of this machine's device, e.g. ``"CPU (2 threads, AVX-512 BF16)"``."""

    @abstractmethod
    def kv_cache_budget_bytes(self, memory_fraction: float, model_bytes: int) -> int:
        """Bytes the KV pool may take, given the fraction of device memory frame may use and the weights' size."""

    @abstractmethod
    def preferred_attention(self, installed: Sequence[str]) -> str:
        """The attention backend ``--attn auto`` picks here, chosen among the ``installed`` backend names."""

    @property
    def default_dtype(self) -> torch.dtype:
        """The dtype ``--dtype auto`` picks here (the fastest one this device computes well)."""
        return torch.float32

    def supported_block_sizes(self) -> Sequence[int] | None:
        """Block sizes this platform's kernels accept; None means any."""
        return None

    def set_up(self) -> None:  # noqa: B027 - optional hook
        """Called once before the model loads (thread counts, allocator settings)."""

    def place_kv_pool(self, pool: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """Called once on a rank's KV pool tensor, allocated but not yet written: the platform may tell the
        operating system how to back it (the cpu platform asks for huge pages, since every decode step reads it).
        Since API 2 (issue 35)."""

    def capture_graph(self, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor] | None:
        """Record one decode step: run ``fn`` under capture and return a function that replays it (returning the
        step's output: the same tensor each time where the recording owns its memory, as a CUDA graph does), or None
        when this platform records no graphs (the default). ``fn`` reads fixed buffers the runner refills before
        each replay. Called once per batch-size bucket, largest first, after the KV pool is allocated; a platform
        may record lazily, on the replay's first call (the cpu platform does). Since API 2."""
        return None

    def greedy_kernel(self) -> Callable[[torch.Tensor, torch.Tensor], None] | None:
        """A kernel ``(logits, out)`` that writes each row's argmax of ``logits`` ``[rows, vocab]`` into ``out``
        (int64 ``[rows]``), as numpy's argmax answers (the first maximum; a NaN counts as the largest), with no host
        reads. The runner puts it at the end of each recorded decode step (:meth:`capture_graph`), so that a step
        whose rows are all plain greedy takes its tokens from there, with no pass over the logits after the step:
        on a CPU that pass runs cold, once the step's weights have streamed through the caches. None (the default):
        the sampler takes the argmax. Since API 2 (issue 35)."""
        return None

    @property
    def distributed_backend(self) -> str:
        """The torch.distributed backend tensor-parallel ranks talk over here (``gloo``, ``nccl``, ...)."""
        return "gloo"

    def for_rank(self, rank: int, world_size: int) -> None:  # noqa: B027 - optional hook
        """Called in a tensor-parallel worker, and in each of several data-parallel engine cores on one host, before
        :meth:`set_up`: take this rank's device (a GPU platform) or its share of the host (the CPU platform divides
        its threads). ``rank`` counts over every such worker on the host (core ``d``'s tensor-parallel rank ``t``
        is ``d * tensor_parallel_size + t``). Since API 2."""

    def layer_kernel(self, layer: torch.nn.Module) -> Callable[..., Any] | None:
        """A faster kernel for one loaded :class:`frame.layers.KernelLayer` here, or None to keep torch's code.

        Called once per such layer (``Linear``, ``SwiGLUProjection``, ``RMSNorm``, ``SiluAndMul``, ``RotateHalves``,
        and the lookup tables ``Embedding`` and ``VocabParallelEmbedding`` whose weight a quantization plugin keeps
        packed) after the weights load. The kernel takes the layer's ``forward`` arguments and returns its result up
        to rounding, or None for a call it does not handle (another dtype or shape), which then runs the layer's
        torch reference. It may keep state made once, such as a prepacked copy of the weight. A linear whose weight
        a quantization plugin keeps packed (``frame.layers.packed_weight(layer)`` is not None) wants the kernel of
        its format (``frame.interfaces.quantization.FORMATS``); without one, the layer multiplies by the dequantised
        weight. A table kept packed (``reads_packed_rows``, its weight on the meta device) wants one that returns
        the rows of its ids without host reads (a step that makes none can be recorded); without one, the rows
        looked up are dequantized (``frame.layers.quantized.embedding_rows``).
        """
        return None

    def kernel_paths(self) -> dict[str, str]:
        """Which code serves each dtype and packed format here, for ``frame plugins``: ``{"float32": "avx2 packed",
        "q4_1": "avx2", ...}``; a dtype or format missing from it runs torch's code (or, packed, the dequantised
        reference). Since API 2."""
        return {}


def rank_device_index(first: int, rank: int, visible: int, what: str = "device") -> int:
    """The device index of rank ``rank`` (tensor-parallel, or counted over every data-parallel core's ranks on one
    host) when the ranks take consecutive devices from ``first``; a ConfigError naming the fix when there are not
    enough of them (for GPU platforms' :meth:`Platform.for_rank`)."""
    from frame.errors import ConfigError

    index = first + rank
    if index >= visible:
        raise ConfigError(
            f"rank {rank} needs {what} {index}, but torch sees {visible}; lower tensor_parallel_size, "
            f"data_parallel_size or device_index.",
            param="tensor_parallel_size",
        )
    return index
