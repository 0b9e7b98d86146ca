"""frame attention backend ``cpu_paged``: paged attention as a native C++ kernel for CPUs."""

__version__ = "0.1.0"
