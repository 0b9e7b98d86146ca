"""Loading the fallback family must stay cheap: the engine loads every model family to find the one that builds a
checkpoint, and transformers' modelling code (with triton under it) would add about 150 MiB to every process."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("transformers.modeling_utils", "triton", "frame_model_transformers.model")


def test_loading_the_plugin_leaves_the_modelling_code_unimported() -> None:
    probe = ("import sys, frame_model_transformers.plugin as plugin\n"
             "assert 'LlamaForCausalLM' in plugin.frame_model_architectures()\n"
             f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "", f"imported while loading the plugin: {done.stdout.strip()}"


def test_the_package_still_offers_its_model_class() -> None:
    import frame_model_transformers
    from frame_model_transformers.model import TransformersModel

    assert frame_model_transformers.TransformersModel is TransformersModel
