"""frame's least-loaded router plugin (``--router least_loaded``)."""

from frame_router_least_loaded.router import LeastLoadedOptions, LeastLoadedRouter

__all__ = ["LeastLoadedOptions", "LeastLoadedRouter"]
