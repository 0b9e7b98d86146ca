"""Does frame compute each packed linear as llama.cpp does? Per tensor type, on a real GGUF's real activations.

    .venv/bin/python benchmarks/ggml_parity.py --gguf FILE [--libggml DIR] [--every 16]

frame loads FILE (``--quantization gguf``, float32) and prefills the first 512 tokens of the shipped text; every
packed linear's input is kept (every ``--every``-th position). Each is then multiplied three ways: by frame's own
kernel for the layer (the path this CPU runs), by llama.cpp's ``ggml_mul_mat`` on the same blocks (the plain CPU
backend of the libggml that llama-cpp-python ships, loaded into this process through ctypes: x rounded to the type's
``vec_dot_type`` exactly as llama.cpp's inference rounds it), and in float64 on gguf's dequantized weight with x
unrounded. Errors are per output, as a share of sum(|w| |x|) of that output, per (type, layer) pair.

frame and llama.cpp round x the same way, so their difference should be float32 noise (about 1e-7); both differ from
the float64 product by x's rounding to int8 (about 1e-3). llama-cpp-python is never frame's dependency: ``--libggml``
names the ``llama_cpp/lib`` folder of an environment that has it.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os

import numpy as np
import torch

TYPES = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_k": 10, "q3_k": 11, "q4_k": 12, "q5_k": 13,
         "q6_k": 14, "iq4_nl": 20, "iq4_xs": 23}


class _Params(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class Ggml:
    """``y = x W^T`` by libggml's ``ggml_mul_mat`` on the CPU backend."""

    def __init__(self, lib_dir: str) -> None:
        ptr = ctypes.c_void_p
        self.base = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(os.path.join(lib_dir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        b = self.base
        b.ggml_init.restype, b.ggml_init.argtypes = ptr, [_Params]
        b.ggml_new_tensor_2d.restype = ptr
        b.ggml_new_tensor_2d.argtypes = [ptr, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        b.ggml_mul_mat.restype, b.ggml_mul_mat.argtypes = ptr, [ptr, ptr, ptr]
        b.ggml_new_graph.restype, b.ggml_new_graph.argtypes = ptr, [ptr]
        b.ggml_build_forward_expand.argtypes = [ptr, ptr]
        b.ggml_get_data.restype, b.ggml_get_data.argtypes = ptr, [ptr]
        b.ggml_nbytes.restype, b.ggml_nbytes.argtypes = ctypes.c_size_t, [ptr]
        b.ggml_free.argtypes = [ptr]
        self.cpu.ggml_graph_compute_with_ctx.argtypes = [ptr, ptr, ctypes.c_int]
        self.cpu.ggml_cpu_init()

    def linear(self, fmt: str, blocks: torch.Tensor, in_features: int, x: torch.Tensor) -> torch.Tensor:
        b, rows, m = self.base, blocks.shape[0], x.shape[0]
        blocks, x = blocks.contiguous(), x.float().contiguous()
        ctx = b.ggml_init(_Params(blocks.numel() + 8 * x.numel() + 4 * m * rows + (64 << 20), None, False))
        try:
            w = b.ggml_new_tensor_2d(ctx, TYPES[fmt], in_features, rows)
            assert b.ggml_nbytes(w) == blocks.numel(), f"{fmt}: the blocks are not ggml's size"
            ctypes.memmove(b.ggml_get_data(w), blocks.data_ptr(), blocks.numel())
            xt = b.ggml_new_tensor_2d(ctx, 0, in_features, m)
            ctypes.memmove(b.ggml_get_data(xt), x.data_ptr(), x.numel() * 4)
            y = b.ggml_mul_mat(ctx, w, xt)
            graph = b.ggml_new_graph(ctx)
            b.ggml_build_forward_expand(graph, y)
            self.cpu.ggml_graph_compute_with_ctx(ctx, graph, torch.get_num_threads())
            out = (ctypes.c_char * (4 * m * rows)).from_address(b.ggml_get_data(y))
            return torch.frombuffer(out, dtype=torch.float32).reshape(m, rows).clone()
        finally:
            b.ggml_free(ctx)


def captured_inputs(path: str, every: int) -> tuple[object, dict[str, torch.Tensor]]:
    """The model and each packed linear's input on the first chunk of the shipped text."""
    from frame.bench.perplexity import Prefiller, bos_of, chunks, token_ids
    from frame.config import EngineConfig
    from frame.layers.quantized import packed_weight

    model = Prefiller(EngineConfig(model=path, quantization="gguf", dtype="float32", platform="cpu"), 512)
    chunk = chunks(token_ids(model.tokenizer), 512, bos_of(model.tokenizer))[0]
    inputs: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in model.worker.runner.model.named_modules():
        if packed_weight(module) is not None and hasattr(module, "kernel"):
            def keep(_: torch.nn.Module, args: tuple, name: str = name) -> None:
                inputs[name] = args[0].detach().reshape(-1, args[0].shape[-1])[::every].float().clone()
            hooks.append(module.register_forward_pre_hook(keep))
    model.logits(chunk)
    for hook in hooks:
        hook.remove()
    return model, inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--libggml", default="/work/llama-venv/lib/python3.11/site-packages/llama_cpp/lib")
    parser.add_argument("--every", type=int, default=16, help="keep every n-th position's input")
    args = parser.parse_args()
    from frame.layers.quantized import packed_weight
    from frame_platform_cpu import quantized

    ggml = Ggml(args.libggml)
    model, inputs = captured_inputs(args.gguf, args.every)
    errors: dict[tuple[str, str], list[list[np.ndarray]]] = collections.defaultdict(lambda: [[], [], []])
    for name, module in model.worker.runner.model.named_modules():
        if name not in inputs:
            continue
        x, packed = inputs[name], packed_weight(module)
        parts = packed.parts if packed.format == "mixed" else [packed]
        for part in parts:
            kernel = quantized.ggml_linear(part, None)
            if kernel is None or part.format not in TYPES:
                continue
            dense = part.dequantize(torch.float32).double()
            exact, scale = x.double() @ dense.T, x.double().abs() @ dense.abs().T
            ours = kernel(x).double()
            theirs = ggml.linear(part.format, part.tensors["blocks"], part.in_features, x).double()
            for slot, diff in enumerate((ours - theirs, ours - exact, theirs - exact)):
                errors[(part.format, name.split(".")[-1])][slot].append((diff / scale).flatten().numpy())
    print(f"{'type':7} {'layer':10} | frame - llama.cpp: max rms | frame - float64: max rms | llama.cpp - float64: "
          "max rms  (shares of sum(|w| |x|))")
    for (fmt, layer), slots in sorted(errors.items()):
        cells = []
        for values in slots:
            e = np.concatenate(values)
            cells.append(f"{np.abs(e).max():.1e} {np.sqrt((e ** 2).mean()):.1e}")
        print(f"{fmt:7} {layer:10} | {cells[0]:>22} | {cells[1]:>20} | {cells[2]:>20}")


if __name__ == "__main__":
    main()
