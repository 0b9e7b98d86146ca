"""frame: a plugin-first LLM inference and serving engine.

Public API: :class:`LLM`, :class:`SamplingParams`, the result types, ``hookimpl`` for plugin authors and the
usage errors. Plugin authors also use ``frame.interfaces``, ``frame.hookspecs``, ``frame.scheduling``,
``frame.sequence``, ``frame.weights`` and ``frame.testing``.
"""

import os as _os

# torch's OpenMP workers spin while they wait. With more runnable threads than cores (a busy or shared host),
# every parallel op then waits out scheduler time slices: measured 10x slower on 2 loaded cores. Passive waiting
# avoids that collapse; OMP_WAIT_POLICY=ACTIVE restores spinning. Only effective before torch is imported.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
