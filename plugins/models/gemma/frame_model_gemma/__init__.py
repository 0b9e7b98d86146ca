"""frame-model-gemma: the Gemma model family (GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM)."""

from frame_model_gemma.args import ARCHITECTURES, GemmaArgs
from frame_model_gemma.model import GemmaModel

__all__ = ["ARCHITECTURES", "GemmaArgs", "GemmaModel"]
