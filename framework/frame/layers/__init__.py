"""Layers model families build from: the matmuls, norms, activation and rotary that a platform may serve with its
own kernels (:mod:`frame.layers.basic`), and their tensor-parallel forms (:mod:`frame.layers.parallel`).

Model families use :class:`QKVParallelLinear`, :class:`RowParallelLinear`, :class:`SwiGLUProjection`,
:class:`VocabParallelEmbedding` and :class:`ParallelLMHead` for the layers that shard, :class:`Linear` for a
matmul that every rank holds whole, :class:`RMSNorm` for norms and :class:`RotateHalves` for rotary embeddings.
Weights a quantization plugin keeps packed reach the same layers (:mod:`frame.layers.quantized`). After loading,
:func:`attach_platform_kernels` asks the platform for a faster kernel per :class:`KernelLayer`.
"""

from frame.layers.basic import (
    KernelLayer,
    LayerKernel,
    Linear,
    RMSNorm,
    RotateHalves,
    SiluAndMul,
    attach_platform_kernels,
    copy_checked,
    empty_parameter,
)
from frame.layers.parallel import (
    ColumnParallelLinear,
    OutputPart,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    SwiGLUProjection,
    VocabParallelEmbedding,
    local_heads,
)
from frame.layers.quantized import finish_loading, packed_weight, weight_bytes

__all__ = [
    "ColumnParallelLinear", "KernelLayer", "LayerKernel", "Linear", "OutputPart", "ParallelLMHead",
    "QKVParallelLinear", "RMSNorm", "RotateHalves", "RowParallelLinear", "SiluAndMul", "SwiGLUProjection",
    "VocabParallelEmbedding", "attach_platform_kernels", "copy_checked", "empty_parameter", "finish_loading",
    "local_heads", "packed_weight", "weight_bytes",
]
