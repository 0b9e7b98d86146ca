"""A third-party model family whose ``frame_model_architectures`` raises is named by `frame generate` for a
checkpoint it might serve: refused with one sentence when no family builds the architecture, one warning line when
the transformers fallback serves it instead, and its raise shown by ``FRAME_TRACE_HOOKS=1``.

The family is really installed for the `frame generate` processes: its package and a ``.dist-info`` folder with
its entry point sit in a folder on their ``PYTHONPATH``, which is all an installed wheel is to importlib.metadata.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from frame.version import API_VERSION

ARCH = "StableLmForCausalLM"
BROKEN = ("the model family 'stablelm' (wheel frame-model-stablelm 0.1.0): its frame_model_architectures raised "
          "ValueError: bad table")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder holding the installed wheel frame-model-stablelm 0.1.0, whose architectures hook raises."""
    folder = tmp_path_factory.mktemp("site")
    package = folder / "frame_model_stablelm"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(f'''
        from frame import hookimpl

        FRAME_API_VERSION = {API_VERSION}


        @hookimpl
        def frame_model_architectures():
            raise ValueError("bad table")


        @hookimpl
        def frame_model_create(hf_config):
            raise AssertionError("never created")
    '''))
    info = folder / "frame_model_stablelm-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: frame-model-stablelm\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[frame.models]\nstablelm = frame_model_stablelm\n")
    return folder


@pytest.fixture(scope="module")
def stablelm(smol_source, tmp_path_factory) -> Path:
    """A random two-layer StableLM with the bundled model's tokenizer: no native in-tree family builds it."""
    import torch
    from transformers import StableLmConfig, StableLmForCausalLM

    folder = tmp_path_factory.mktemp("stablelm")
    torch.manual_seed(0)
    config = StableLmConfig(vocab_size=len(smol_source.tokenizer), hidden_size=64, intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                            max_position_embeddings=256)
    StableLmForCausalLM(config).save_pretrained(folder)
    smol_source.tokenizer.save_pretrained(folder)
    return folder


def _generate(site: Path, model: Path, **env: str) -> subprocess.CompletedProcess:
    environ = dict(os.environ, **env)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "frame.cli.main", "generate", "--model", str(model), "--prompt",
                           "hi", "--max-tokens", "2", "--dtype", "float32", "--raw"],
                          env=environ, capture_output=True, text=True, timeout=600)


def test_without_the_fallback_the_broken_family_is_named_instead_of_install_advice(site, stablelm) -> None:
    out = _generate(site, stablelm, FRAME_DISABLE_PLUGINS="model:transformers")
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"error: No working model family builds {ARCH}, and one that may is broken ({BROKEN}); "
                           "fix or reinstall that wheel (working families: "), line
    assert "install a frame-model-*" not in line


def test_the_fallback_serves_but_names_the_broken_family_in_one_line(site, stablelm) -> None:
    out = _generate(site, stablelm)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "stablelm" in line]
    assert warnings == [
        f"WARNING frame.plugins: The fallback family 'transformers' serves {ARCH}, but a family that may build it "
        f"natively is broken ({BROKEN}); fix or reinstall that wheel, or set FRAME_DISABLE_PLUGINS=model:stablelm "
        "if it is not meant to serve it."
    ], out.stderr


def test_disabling_the_broken_family_silences_the_warning(site, stablelm) -> None:
    out = _generate(site, stablelm, FRAME_DISABLE_PLUGINS="model:stablelm")
    assert out.returncode == 0, out.stderr
    assert "stablelm" not in out.stderr, out.stderr


def test_tracing_shows_the_raise(site, stablelm) -> None:
    out = _generate(site, stablelm, FRAME_DISABLE_PLUGINS="model:transformers", FRAME_TRACE_HOOKS="1")
    assert out.returncode == 2
    assert "model:stablelm frame_model_architectures raised ValueError: bad table" in out.stderr
    assert 'raise ValueError("bad table")' in out.stderr  # the traceback, down to the plugin's line
