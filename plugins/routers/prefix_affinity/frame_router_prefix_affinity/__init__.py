"""frame's prefix-affinity router plugin (``--router prefix_affinity``)."""

from frame_router_prefix_affinity.router import PrefixAffinityOptions, PrefixAffinityRouter

__all__ = ["PrefixAffinityOptions", "PrefixAffinityRouter"]
