"""benchmarks/stand_in.py: what a stand-in hands each side, checked in real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from frame.native import disabled_cpu_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import stand_in


@pytest.mark.parametrize("name", sorted(stand_in.STAND_INS))
def test_the_peer_process_sees_the_stood_in_class(name: str, tmp_path: Path) -> None:
    env = {**os.environ, **stand_in.peer_env(name, tmp_path / "shim")}
    probes = ["_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_avx2_supported"]
    code = f"import torch; print(' '.join(str(getattr(torch.cpu, p)()) for p in {probes!r}))"
    seen = dict(zip(probes, subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                           check=True).stdout.split(), strict=True))
    for probe in stand_in.STAND_INS[name].hidden:
        if probe in seen:
            assert seen[probe] == "False", (probe, seen)
    import torch

    assert seen["_is_avx2_supported"] == str(torch.cpu._is_avx2_supported())  # what the class keeps is untouched


def test_the_peer_keeps_its_own_python_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    path = stand_in.peer_env("avx2", tmp_path)["PYTHONPATH"]
    assert path.split(os.pathsep) == [str(tmp_path), "/somewhere"]
    assert stand_in.peer_env(None, tmp_path) == {}


@pytest.mark.parametrize("name", sorted(stand_in.STAND_INS))
def test_frame_knows_the_flags_a_stand_in_takes_away(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAME_CPU_DISABLE", stand_in.STAND_INS[name].frame_disable)
    assert stand_in.STAND_INS[name].frame_disable in disabled_cpu_flags()


def test_entering_a_stand_in_already_set_does_not_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = stand_in.STAND_INS["avx2"]
    for key, value in {**chosen.env, "FRAME_CPU_DISABLE": chosen.frame_disable}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(os, "execv", lambda *args: pytest.fail("re-executed with the environment already set"))
    stand_in.enter("avx2")
    stand_in.enter(None)
