"""The bundled GGUF read packed answers a request the same whether the prefix cache served most of its prompt or
none of it.

Packed kernels round activations to int8 per block, so a last-bit difference anywhere before them becomes a whole
rounding step. Sent twice, a prompt's second run finds all its full blocks cached and computes its last one or
two tokens alone, which took cpu_paged's decode path: its scores summed in another order than the prefill tile of
the first run, and SmolLM2 Q4_1 answered "1. Bananas" then "1. Grapes" (issue 30).
"""

from __future__ import annotations

import os

from frame import LLM, SamplingParams
from frame.engine.core.loop import ready_message

ASK = [{"role": "user", "content": "Name three fruits."}]
BLOCK = 16


def test_a_packed_gguf_answers_a_prefix_cache_hit_as_the_whole_prompt() -> None:
    llm = LLM(dtype="float32", max_model_len=512, block_size=BLOCK, cache="hashchain", attn="cpu_paged",
              quantization="gguf")
    try:
        assert ready_message(llm.engine, os.getpid()).quantization == "gguf"
        prompt = llm.get_tokenizer().apply_chat_template(ASK, add_generation_prompt=True, tokenize=True,
                                                         return_dict=False)
        assert len(prompt) % BLOCK in (1, 2), "the second run must compute its last one or two tokens alone"
        params = SamplingParams(temperature=0.0, max_tokens=24, logprobs=1)
        first, second = (llm.chat([ASK], params)[0].outputs[0] for _ in range(2))
        assert llm.stats().prefix_hit_tokens > 0
        assert second.token_ids == first.token_ids
        assert second.logprobs == first.logprobs
    finally:
        llm.shutdown()
