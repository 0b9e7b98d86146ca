"""frame.native: where builds go, when they are reused, and what it says when nothing can be built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from frame import native

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
    native.load_library("frame_native_test", [source], ["-O1"])
    assert native.is_built("frame_native_test", [source], ["-O1"])
    assert torch.equal(torch.ops.frame_native_test.twice(torch.ones(3)), torch.full((3,), 2.0))
    native.load_library("frame_native_test", [source], ["-O1"])  # a no-op once loaded
