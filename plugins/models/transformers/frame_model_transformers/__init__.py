"""frame-model-transformers: the fallback model family, running transformers' own modules over frame's paged KV."""

from frame_model_transformers.model import TransformersModel

__all__ = ["TransformersModel"]
