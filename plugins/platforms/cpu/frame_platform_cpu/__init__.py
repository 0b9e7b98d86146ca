"""frame-platform-cpu: the host CPU as a frame platform."""

from frame_platform_cpu.platform import CpuOptions, CpuPlatform

__all__ = ["CpuOptions", "CpuPlatform"]
