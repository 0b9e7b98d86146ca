"""frame-model-transformers: the fallback model family, running transformers' own modules over frame's paged KV."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from frame_model_transformers.model import TransformersModel

__all__ = ["TransformersModel"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the plugin module is loaded whenever a family is chosen (see plugin.py).
    if name == "TransformersModel":
        from frame_model_transformers.model import TransformersModel

        return TransformersModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
