"""A lesser CPU class stood in for on this one, for frame and its peer alike: ``--stand-in avx2|avx512``.

``FRAME_CPU_DISABLE`` alone makes frame run a lesser class's kernels while vLLM keeps this CPU's (its AVX-512 BF16
library, oneDNN's bfloat16 and AMX paths), which measures two classes against each other. A stand-in takes the
same instructions from both sides:

- frame: ``FRAME_CPU_DISABLE`` (its kernels are built without the flags);
- torch in both processes: ``ATEN_CPU_CAPABILITY`` (ATen's vectorised kernels), ``ONEDNN_MAX_CPU_ISA`` (oneDNN's
  JIT kernels, which vLLM-CPU's linears run on) and ``MKL_ENABLE_INSTRUCTIONS``;
- vLLM: it picks its native library (``_C``, ``_C_AVX512``, ``_C_AVX2``) and its attention's ISA from
  ``torch.cpu._is_avx512_supported()`` and its siblings, which read the CPU itself; a ``sitecustomize`` put first on
  vLLM's ``PYTHONPATH`` makes them answer as the stood-in class would.

The result is still this CPU's caches, memory and clock running the other class's instructions: numbers to compare
code paths with, not the class's own (docs/performance.md says which rows are stand-ins).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StandIn:
    """One stood-in class: what frame leaves out, the environment both sides get, the probes vLLM sees as False."""

    frame_disable: str
    env: dict[str, str]
    hidden: tuple[str, ...]


STAND_INS: dict[str, StandIn] = {
    # AMD Zen 2 / Zen 3, Intel client parts: AVX2 and FMA only.
    "avx2": StandIn("avx512f", {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
                    ("_is_avx512_supported", "_is_vnni_supported", "_is_avx512_bf16_supported",
                     "_is_amx_tile_supported", "_is_amx_fp16_supported")),
    # Intel Ice Lake / Cascade Lake: AVX-512 with VNNI, no BF16, no AMX.
    "avx512": StandIn("avx512_bf16", {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"},
                      ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported")),
}


def enter(name: str | None) -> None:
    """Run this benchmark under stand-in ``name``: re-executes the process once with the environment set, since
    ATen, oneDNN and MKL read it when they load. Returns at once when ``name`` is None or it is already set."""
    if name is None:
        return
    stand_in = STAND_INS[name]
    wanted = {**stand_in.env, "FRAME_CPU_DISABLE": stand_in.frame_disable}
    if all(os.environ.get(key) == value for key, value in wanted.items()):
        return
    os.environ.update(wanted)
    os.execv(sys.executable, [sys.executable, *sys.argv])


def peer_env(name: str | None, folder: Path) -> dict[str, str]:
    """The environment vLLM's process gets on top of the benchmark's own: its CPU probes answered as stand-in
    ``name``'s class would, by a ``sitecustomize`` written into ``folder`` (a temporary one of the caller's)."""
    if name is None:
        return {}
    hidden = STAND_INS[name].hidden
    lines = ["# Written by frame's benchmarks/stand_in.py: vLLM sees the CPU class it stands in for.", "import torch"]
    lines += [f"torch.cpu.{probe} = lambda: False" for probe in hidden]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": f"{folder}{os.pathsep}{path}" if path else str(folder)}
