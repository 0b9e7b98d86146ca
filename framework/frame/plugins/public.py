"""The core's public API for plugins: the modules a plugin may import.

Everything else in ``frame`` (the engine, the server, the CLI, the registry) may change without notice. A plugin
imports these modules and their submodules only; docs/plugins.md lists them, and the tests check both that the
list there is this one and that every in-tree plugin keeps to it.
"""

from __future__ import annotations

PUBLIC_MODULES: tuple[str, ...] = (
    "frame",                  # hookimpl, API_VERSION, SamplingParams, the result types, the usage errors
    "frame.config",           # EngineConfig, for lifecycle hooks that receive it
    "frame.errors",           # the usage errors a plugin raises for mistakes a user can fix
    "frame.hookspecs",        # hookimpl and the hook contracts
    "frame.interfaces",       # the abstract base of every kind and its result types
    "frame.layers",           # model building blocks a platform may give faster kernels
    "frame.native",           # build and load a plugin's C++ torch ops
    "frame.parallel",         # the tensor-parallel context and head partitions, for model families and layers
    "frame.sampling_params",
    "frame.sequence",
    "frame.testing",          # the conformance suites and in-process registration
    "frame.weights",          # checkpoint readers, for model families
)


def is_public(module: str) -> bool:
    """True when ``module`` is one of :data:`PUBLIC_MODULES` or inside one (``frame`` itself counts alone)."""
    return module in PUBLIC_MODULES or any(
        module.startswith(public + ".") for public in PUBLIC_MODULES if public != "frame"
    )
