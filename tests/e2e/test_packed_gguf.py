"""The bundled GGUF, read packed (a .gguf's default), answers a request the same whether the prefix cache served
most of its prompt or none of it.

Packed kernels round activations to int8 per block, so a last-bit difference anywhere before them becomes a whole
rounding step. Sent twice, a prompt's second run finds all its full blocks cached and computes its last one or
two tokens alone, which took cpu_paged's decode path: its scores summed in another order than the prefill tile of
the first run, and SmolLM2 Q4_1 answered "1. Bananas" then "1. Grapes" (issue 30). In bfloat16 the decode path
and the prefill path cannot sum alike (on AMX they run on different units), so cpu_paged gives the rows the
metadata marks as prompt rows the prefill path however few they are; each CPU class's code is checked in a process
of its own (``FRAME_CPU_DISABLE`` builds the kernels for that class). Building four lesser classes' kernels
takes about seven minutes on 2 cores, longer than the rest of the suite's slowest file, so the suite runs this
machine's own class and ``FRAME_TEST_EVERY_CPU_CLASS=1`` adds the others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from frame import LLM, SamplingParams, native
from frame.engine.core.loop import ready_message

ASK = [{"role": "user", "content": "Name three fruits."}]
BLOCK = 16


def test_a_packed_gguf_answers_a_prefix_cache_hit_as_the_whole_prompt() -> None:
    llm = LLM(dtype="float32", max_model_len=512, block_size=BLOCK, cache="hashchain", attn="cpu_paged")
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


# One fresh request, then the same request served by the prefix cache, in bfloat16: what each answered, as JSON.
BFLOAT16_TWICE = f"""
import json, os
from frame import LLM, SamplingParams
from frame.engine.core.loop import ready_message
llm = LLM(dtype="bfloat16", max_model_len=512, block_size={BLOCK}, cache="hashchain", attn="cpu_paged")
ready = ready_message(llm.engine, os.getpid())
prompt = llm.get_tokenizer().apply_chat_template({ASK!r}, add_generation_prompt=True, tokenize=True, return_dict=False)
params = SamplingParams(temperature=0.0, max_tokens=24, logprobs=1)
runs = [llm.chat([{ASK!r}], params)[0].outputs[0] for _ in range(2)]
print(json.dumps({{"quantization": ready.quantization, "dtype": ready.dtype, "tail": len(prompt) % {BLOCK},
                  "hits": llm.stats().prefix_hit_tokens,
                  "runs": [[r.token_ids, [sorted((t, p.logprob) for t, p in lp.items()) for lp in r.logprobs]]
                           for r in runs]}}))
llm.shutdown()
"""

# The CPU classes this machine can stand in for (FRAME_CPU_DISABLE), by the flag whose absence makes each: itself,
# AVX-512 BF16 without AMX (Zen 4), AVX-512 VNNI (Ice Lake, Cascade Lake), AVX-512 without VNNI (Skylake), AVX2.
CLASSES = {"native": "", "avx512_bf16": "amx_tile", "avx512_vnni": "avx512_bf16",
           "avx512f": "avx512_bf16,avx512_vnni", "avx2": "avx512f"}


@pytest.mark.slow
@pytest.mark.needs_bfloat16
@pytest.mark.parametrize("cpu_class", list(CLASSES))
def test_a_packed_gguf_answers_a_prefix_cache_hit_as_the_whole_prompt_in_bfloat16(cpu_class: str) -> None:
    disable = CLASSES[cpu_class]
    flag = cpu_class if cpu_class != "native" else None
    if flag is not None and os.environ.get("FRAME_TEST_EVERY_CPU_CLASS") != "1":
        pytest.skip("builds that class's kernels (minutes); FRAME_TEST_EVERY_CPU_CLASS=1 runs it")
    if flag is not None and flag not in native.cpu_flags():
        pytest.skip(f"this CPU has no {flag}: it cannot run that class's code")
    disabled = ",".join(filter(None, (os.environ.get(native.DISABLE_ENV, ""), disable)))
    env = {**os.environ, native.DISABLE_ENV: disabled}
    done = subprocess.run([sys.executable, "-c", BFLOAT16_TWICE], capture_output=True, text=True, env=env,
                          timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert (seen["quantization"], seen["dtype"]) == ("gguf", "bfloat16")
    assert seen["tail"] in (1, 2), "the second run must compute its last one or two tokens alone"
    assert seen["hits"] > 0
    first, second = seen["runs"]
    assert second[0] == first[0]
    assert second[1] == first[1]
