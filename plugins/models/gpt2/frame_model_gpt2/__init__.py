"""frame-model-gpt2: the GPT-2 model family (GPT2LMHeadModel)."""

from frame_model_gpt2.model import GPT2Args, GPT2Model

__all__ = ["GPT2Args", "GPT2Model"]
