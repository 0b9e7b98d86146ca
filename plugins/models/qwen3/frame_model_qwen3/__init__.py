"""frame-model-qwen3: the Qwen3 model family (Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM)."""

from frame_model_qwen3.args import ARCHITECTURES, QwenArgs
from frame_model_qwen3.model import QwenModel

__all__ = ["ARCHITECTURES", "QwenArgs", "QwenModel"]
