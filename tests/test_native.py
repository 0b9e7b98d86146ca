"""frame.native: where builds go, when they are reused, and what it says when nothing can be built."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from frame import derived_cache, native
from frame.errors import ConfigError

SOURCE = '''
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <torch/library.h>
at::Tensor twice(const at::Tensor& x) { return at::add(x, x); }
TORCH_LIBRARY(frame_native_test, m) { m.def("twice(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(frame_native_test, CPU, m) { m.impl("twice", &twice); }
'''


def test_the_build_folder_pins_sources_and_flags(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path))
    source = tmp_path / "op.cpp"
    source.write_text(SOURCE)
    first = native.build_directory("op", [source], ["-O2"])
    assert first.parent == tmp_path / "kernels" and first.name.startswith("op-")
    assert native.build_directory("op", [source], ["-O3"]) != first
    source.write_text(SOURCE + "\n// changed\n")
    assert native.build_directory("op", [source], ["-O2"]) != first
    changed = native.build_directory("op", [source], ["-O2"])
    (tmp_path / "helpers.h").write_text("#pragma once\n")
    assert native.build_directory("op", [source], ["-O2"]) != changed  # a header beside the source counts
    assert not native.is_built("op", [source], ["-O2"])


def test_without_a_compiler_the_reason_names_the_fix(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    source = tmp_path / "op.cpp"
    source.write_text(SOURCE)
    reason = native.unavailable_reason("op", [source], [])
    assert reason == ("needs a C++ compiler to build its kernel, and 'no-such-compiler' is not on PATH "
                      "(install g++ or set CXX)")


@pytest.mark.skipif(native.missing_tools() is not None, reason="no C++ toolchain here")
def test_builds_once_then_loads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path))
    source = tmp_path / "op.cpp"
    source.write_text(SOURCE)
    old_build = tmp_path / "kernels" / "frame_native_test-0123456789abcdef"  # an older frame's, unused for months
    old_build.mkdir(parents=True)
    long_ago = time.time() - derived_cache.UNUSED_BUILD_S - 60
    os.utime(old_build, (long_ago, long_ago))
    native.load_library("frame_native_test", [source], ["-O1"])
    assert native.is_built("frame_native_test", [source], ["-O1"])
    build = native.build_directory("frame_native_test", [source], ["-O1"])
    assert (build / derived_cache.USED_MARK).is_file() and not old_build.exists()
    assert torch.equal(torch.ops.frame_native_test.twice(torch.ones(3)), torch.full((3,), 2.0))
    native.load_library("frame_native_test", [source], ["-O1"])  # a no-op once loaded


def test_disabling_cpu_flags_stands_in_for_a_lesser_cpu(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_proc_cpu_flags", lambda: frozenset(
        {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"}))
    source = tmp_path / "op.cpp"
    source.write_text(SOURCE)
    native_build = native.build_directory("op", [source], ["-O2"])
    monkeypatch.setenv(native.DISABLE_ENV, "avx512_bf16")
    # The flag goes, and AMX with it (its tiles are only used beside AVX-512 BF16): probes see a Cascade Lake.
    assert native.disabled_cpu_flags() == {"avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}
    assert native.cpu_flags() == {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
    assert native._without_switches() == ["-mno-amx-bf16", "-mno-amx-int8", "-mno-amx-tile", "-mno-avx512bf16"]
    assert native.build_directory("op", [source], ["-O2"]) != native_build  # built apart, never mixed up
    monkeypatch.setenv(native.DISABLE_ENV, " avx512f, ")  # AVX2 only: every AVX-512 flag goes
    assert native.cpu_flags() == {"avx2", "fma"}


def test_an_unknown_flag_to_disable_is_refused_in_one_sentence(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(native.DISABLE_ENV, "avx512_bf16,sse2, amx")
    refusal = ("FRAME_CPU_DISABLE names amx, sse2, which are not CPU flags frame can build without; name some of "
               "amx_bf16, amx_int8, amx_tile, avx2, avx512_bf16, avx512_fp16, avx512_vnni, avx512bw, avx512f, fma "
               "(comma-separated), or unset it.")
    with pytest.raises(ConfigError) as raised:
        native.cpu_flags()
    assert str(raised.value) == refusal
    # A kernel's availability check raises it too, rather than reporting a machine without kernels.
    source = tmp_path / "op.cpp"
    source.write_text(SOURCE)
    with pytest.raises(ConfigError, match=r"^FRAME_CPU_DISABLE names amx, sse2"):
        native.unavailable_reason("op", [source], [])


@pytest.mark.skipif(native.missing_tools() is not None or "avx2" not in native.cpu_flags(),
                    reason="needs a C++ toolchain and an x86 CPU with AVX2")
def test_a_disabled_flag_leaves_its_instructions_out_of_the_build(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(native.DISABLE_ENV, "avx2")
    source = tmp_path / "isa.cpp"
    source.write_text(SOURCE.replace("frame_native_test", "frame_native_isa").replace(
        "at::Tensor twice", "#ifdef __AVX2__\n#error built with AVX2\n#endif\nat::Tensor twice"))
    native.load_library("frame_native_isa", [source], ["-O1", "-march=native"])  # fails to compile with AVX2
    assert torch.equal(torch.ops.frame_native_isa.twice(torch.ones(2)), torch.full((2,), 2.0))
