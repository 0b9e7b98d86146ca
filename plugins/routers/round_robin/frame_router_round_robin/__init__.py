"""frame's round-robin router plugin (``--router round_robin``)."""

from frame_router_round_robin.router import RoundRobinRouter

__all__ = ["RoundRobinRouter"]
