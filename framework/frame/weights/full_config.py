"""A GGUF's rebuilt config, completed once with its transformers class's defaults and read back without that class.

transformers' config class for an architecture (``LlamaConfig``) holds defaults frame's families read where a
config.json leaves them out (Llama's ``hidden_act``, Qwen2's ``layer_types``), but importing its module imports
much of transformers (its activations, accelerate, the kernels hub, PIL: about 60 MiB resident and 0.6 s on a
Zen 5, transformers 5). frame writes a GGUF's config.json itself (:mod:`frame.weights.gguf_config`), so it writes
the class's every attribute there once, in a child process unless this one has imported the class already, and
each later load reads it as a plain ``PretrainedConfig``: the engine that serves a GGUF never imports the module.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def with_class_defaults_here(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as its transformers class holds it (defaults filled in), with each alias the class maps (GPT-2's
    ``hidden_size`` for ``n_embd``)."""
    from transformers import AutoConfig

    fields = dict(config)
    built = AutoConfig.for_model(fields.pop("model_type"), **fields)
    full = built.to_dict()
    for alias, name in type(built).attribute_map.items():
        if name in full:
            full.setdefault(alias, full[name])
    return full


def _child_program() -> str:
    """The child's program: the function above, from this file's source, on the dict on stdin (importing frame
    itself would double the child's second or two)."""
    return "\n".join(["import json, sys", "from typing import Any", inspect.getsource(with_class_defaults_here),
                      "json.dump(with_class_defaults_here(json.load(sys.stdin)), sys.stdout)"])


def _class_imported(model_type: str) -> bool:
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(model_type)
    return f"transformers.models.{module}.configuration_{module}" in sys.modules


def with_class_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """:func:`with_class_defaults_here`, in a child process unless this one imported the class already."""
    if _class_imported(config["model_type"]):
        return with_class_defaults_here(config)
    child = subprocess.run([sys.executable, "-c", _child_program()], input=json.dumps(config), capture_output=True,
                           text=True, check=False)
    if child.returncode != 0:
        last = (child.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"completing the {config['model_type']} config from transformers failed: {last}")
    return json.loads(child.stdout)


def read_full_config(file: Path) -> PretrainedConfig:
    """A config.json :func:`with_class_defaults` wrote, as a plain ``PretrainedConfig`` (the class not imported)."""
    from transformers import PretrainedConfig

    return PretrainedConfig.from_dict(json.loads(file.read_text()))


def concrete_config(config: PretrainedConfig) -> PretrainedConfig:
    """A plain config :func:`read_full_config` read, as an instance of its architecture's transformers class (for
    code that needs the class itself: transformers' own modules)."""
    from transformers import AutoConfig

    fields = config.to_dict()
    del fields["model_type"]  # to_dict writes the plain class's empty one; the instance keeps the file's
    return AutoConfig.for_model(config.model_type, **fields)
