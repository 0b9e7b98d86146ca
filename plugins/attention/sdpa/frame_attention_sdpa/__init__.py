"""frame-attention-sdpa: paged attention built on torch's scaled_dot_product_attention."""

from frame_attention_sdpa.backend import SdpaAttention

__all__ = ["SdpaAttention"]
