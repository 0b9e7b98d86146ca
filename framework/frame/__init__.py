"""frame: a plugin-first LLM inference and serving engine.

Public API: :class:`LLM`, :class:`SamplingParams`, the result types, ``hookimpl`` for plugin authors and the
usage errors. Plugins import only the modules in :data:`frame.plugins.public.PUBLIC_MODULES` (docs/plugins.md).
"""

from frame.errors import FrameUsageError
from frame.hookspecs import hookimpl
from frame.outputs import CompletionOutput, Logprob, RequestOutput
from frame.sampling_params import SamplingParams
from frame.version import API_VERSION, __version__


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    # LLM pulls in the engine (torch, transformers); plugins importing `frame` should not pay for it.
    if name == "LLM":
        from frame.llm import LLM

        return LLM
    raise AttributeError(name)


__all__ = [
    "API_VERSION",
    "LLM",
    "CompletionOutput",
    "FrameUsageError",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
    "__version__",
    "hookimpl",
]
