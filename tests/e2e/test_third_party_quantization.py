"""A third-party quantization wheel with a packed format of its own: int4 in groups of 128 inputs
(``third_party/int4_g128``, which declares ``int4_g128`` with its layout and reference dequantization).

Its own tests (frame's quantization suite, on the suite's dense tiny checkpoint) pass before it is installed; built
and installed as a wheel, it serves `frame generate --quantization int4_g128` on the bundled model; and the same
suite fails a method whose packed weights are zeros.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest

WHEEL = Path(__file__).parent / "third_party" / "int4_g128"
pytestmark = pytest.mark.slow


def _copy(target: Path) -> Path:
    """A clean copy of the wheel's folder, so running or building it leaves nothing in the checkout."""
    shutil.copytree(WHEEL, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    return target


def _pytest(folder: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[ElementTree.Element]]:
    report = folder / "report.xml"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                             f"--junitxml={report}", *args], cwd=folder, capture_output=True, text=True, timeout=600)
    return result, list(ElementTree.parse(report).iter("testcase"))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The wheel built from the folder and installed into a folder of its own (put on PYTHONPATH to use it)."""
    root = tmp_path_factory.mktemp("int4")
    source, wheels, site = _copy(root / "source"), root / "wheels", root / "site"
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
    pip = [sys.executable, "-m", "pip", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)], env=env,
                   check=True)
    [wheel] = wheels.glob("frame_quantization_int4_g128-0.1.0-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)], env=env,
                   check=True)
    return site


def test_its_own_tests_pass_before_it_is_installed(tmp_path: Path) -> None:
    result, cases = _pytest(_copy(tmp_path / "int4_g128"))
    assert result.returncode == 0, result.stdout[-3000:]
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    assert len(cases) >= 7 and not skipped, (len(cases), skipped)


def test_the_installed_wheel_serves_frame_generate(site: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    # INFO logging, so the layers say which format they multiply by (frame's own CLI logs warnings only).
    script = ("import logging, sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); "
              "from frame.cli.main import main; sys.exit(main(sys.argv[1:]))")
    out = subprocess.run([sys.executable, "-c", script, "generate", "--quantization", "int4_g128", "--prompt",
                          "What is the capital of France?", "--max-tokens", "12", "--dtype", "float32",
                          "--max-model-len", "256"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "no kernel serves int4_g128 weights here" in out.stderr, out.stderr[-3000:]
    assert "Paris" in out.stdout, out.stdout


ZEROS = '''
    """The int4_g128 wheel's format with every code at zero: weights of the right shape and format, and no values."""

    import torch
    from frame import hookimpl
    from frame.plugins.hooks import PluginHooks
    from frame.plugins.registry import PluginRegistry
    from frame.testing.quantization import QuantizationConformance
    from frame.testing.registration import plugin_module
    from frame_quantization_int4_g128.method import Int4Group128, Int4Group128Method
    import pytest


    class Zeros(Int4Group128Method):
        def quantize(self, name, weight, input_absmax=None):
            rows, inputs = weight.shape
            if inputs % 128:
                return None
            q = torch.full((rows, inputs // 2), 0x88, dtype=torch.uint8)
            return Int4Group128({"q": q, "scale": torch.ones(rows, inputs // 128)}, inputs)


    @hookimpl
    def frame_quantization_create(options):
        return Zeros()


    class TestZeros(QuantizationConformance):
        plugin_name = "zeros"
        rtol = 1 / 14 * (1 + 1e-3)

        @pytest.fixture(scope="class")
        def hooks(self):
            registry = PluginRegistry()
            registry.register("quantization", "zeros", plugin_module("zeros",
                              frame_quantization_create=frame_quantization_create))
            return PluginHooks(registry)
'''


def test_a_method_that_returns_zeros_fails_the_suite(tmp_path: Path) -> None:
    folder = _copy(tmp_path / "zeros")
    (folder / "tests" / "test_zeros.py").write_text(textwrap.dedent(ZEROS))
    result, cases = _pytest(folder, "tests/test_zeros.py")
    failed = {c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None}
    assert result.returncode == 1, result.stdout[-3000:]
    assert failed == {"test_packed_weights_hold_the_checkpoint", "test_model_keeps_the_dense_models_logits"}, (
        failed, result.stdout[-3000:])
