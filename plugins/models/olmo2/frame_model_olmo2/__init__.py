"""frame-model-olmo2: the OLMo 2 model family (Olmo2ForCausalLM)."""

from frame_model_olmo2.model import Olmo2Args, Olmo2Model

__all__ = ["Olmo2Args", "Olmo2Model"]
