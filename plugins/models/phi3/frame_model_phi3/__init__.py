"""frame-model-phi3: the Phi-3 model family (Phi3ForCausalLM: Phi-3 mini/medium, Phi-3.5-mini, Phi-4, Phi-4-mini)."""

from frame_model_phi3.model import Phi3Args, Phi3Model

__all__ = ["Phi3Args", "Phi3Model"]
