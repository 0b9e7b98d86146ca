"""A Gemma 3 text model in a q8_0 GGUF written as llama.cpp's converter writes it (five local layers to one global,
a window, the global rope base with linear scaling, norms stored ``+ 1``), served through the engine: the family
comes from the file, the weights run packed by default, and dense weights on request give transformers' greedy
tokens on the values the file holds."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import pytest
import torch
from frame import LLM, SamplingParams
from frame.engine.core.loop import ready_message
from frame.testing.gguf import as_stored, write_gguf
from frame.testing.model import TINY, randomize_
from frame.weights import open_weights
from frame_platform_cpu.platform import CpuPlatform
from transformers import AutoModelForCausalLM, Gemma3TextConfig

ROPE = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
PROMPT = [1, 5, 9, 14, 3, 27, 8, 40, 11, 6]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """(transformers' model holding the file's values, the GGUF file)."""
    config = Gemma3TextConfig(**{**TINY, "num_hidden_layers": 6, "tie_word_embeddings": True}, head_dim=16,
                              query_pre_attn_scalar=16, sliding_window=4, rope_parameters=ROPE,
                              architectures=["Gemma3ForCausalLM"], pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    randomize_(reference, seed=3)
    folder = tmp_path_factory.mktemp("gemma3")
    reference.save_pretrained(folder)

    def keys(writer: gguf.GGUFWriter) -> None:  # what the converter's Gemma3Model writes beyond every model's
        writer.add_sliding_window(4)
        writer.add_rope_freq_base(100000.0)
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(2.0)

    path = folder / "tiny-gemma3.Q8_0.gguf"
    write_gguf(open_weights(folder), path, "GEMMA3", 6, lambda n, t: t + 1 if n.endswith("norm.weight") else t,
               config=config, file_type="q8_0", metadata=keys)
    with torch.no_grad():
        for name, param in reference.named_parameters():
            param.copy_(as_stored(param.data, "q8_0", name))
    return reference, path


def test_the_file_serves_as_gemma3_packed_by_default_and_dense_on_request(gemma3) -> None:
    reference, path = gemma3
    with torch.no_grad():
        out = reference.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False, pad_token_id=0)
    expected = out[0, len(PROMPT):].tolist()
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    dense = LLM(model=str(path), dtype="float32", max_model_len=64, quantization="none")
    ready = ready_message(dense.engine, os.getpid())
    assert (ready.family, ready.quantization) == ("gemma", None)
    assert dense.generate({"prompt_token_ids": PROMPT}, params)[0].outputs[0].token_ids == expected
    dense.shutdown()
    packed = LLM(model=str(path), dtype="float32", max_model_len=64)
    platform = packed.engine.selection.platform
    kernels = "q8_0" in platform.kernel_paths()
    assert ready_message(packed.engine, os.getpid()).quantization == ("gguf" if kernels else None)
    assert len(packed.generate({"prompt_token_ids": PROMPT}, params)[0].outputs[0].token_ids) == 8
    packed.shutdown()


@pytest.mark.parametrize(("dtype", "steps"), [("float32", 1), ("float32", 4), pytest.param("bfloat16", 1, marks=(
    pytest.mark.skipif(torch.bfloat16 not in CpuPlatform().supported_dtypes, reason="the CPU has no bfloat16 path")))])
def test_recorded_decode_steps_read_each_kv_groups_tables(gemma3, dtype: str, steps: int) -> None:
    """Gemma 3's windowed layers keep their KV in groups of their own, each with its block tables: a recorded
    decode step fills every group's slots and tables (``DecodeGraphs``), and gives the eager step's tokens past the
    window and across blocks, with padding rows and with continuous decode steps (each moving every group's
    slots). The step's norms and GeGLU are the cpu platform's kernels, run by its teams."""
    _, path = gemma3
    prompts = [PROMPT, [*PROMPT, *PROMPT[:7]], [*PROMPT, *PROMPT, *PROMPT]]  # 10, 17 and 30 tokens: bucket 4
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    args = dict(model=str(path), dtype=dtype, max_model_len=64, max_num_seqs=4, num_continuous_decode_steps=steps)

    def tokens(llm: LLM) -> list[list[int]]:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        return [o.outputs[0].token_ids for o in outputs]

    eager_llm = LLM(**args, cuda_graphs=False)
    eager = tokens(eager_llm)
    eager_llm.shutdown()
    llm = LLM(**args, record_graphs_at_start=True)  # each bucket replayed over padding rows first, as frame serve does
    runner = llm.engine.executor.worker.runner
    assert runner.kv_groups.num_groups > 1 and runner.graphs is not None
    assert len(runner.graphs.block_tables) == runner.kv_groups.num_groups
    assert tokens(llm) == eager
    assert runner.graphs.replays[4].calls > 100  # recorded natively, not run eagerly
    llm.shutdown()
