"""frame-model-llama: the Llama model family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
GraniteForCausalLM, MixtralForCausalLM)."""

from frame_model_llama.args import ARCHITECTURES, LlamaArgs
from frame_model_llama.model import LlamaModel

__all__ = ["ARCHITECTURES", "LlamaArgs", "LlamaModel"]
