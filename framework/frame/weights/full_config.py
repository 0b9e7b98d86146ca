"""A checkpoint's config, completed once with its transformers class's defaults and read back without that class.

transformers' config class for an architecture (``LlamaConfig``) holds defaults frame's families read where a
config.json leaves them out (Llama's ``hidden_act``, Qwen2's ``layer_types``), but importing its module imports
much of transformers (its activations, accelerate, the kernels hub, PIL: about 60 MiB resident and 0.6 s on a
Zen 5, transformers 5). So the class's every attribute is written out once, in a child process unless this one
has imported the class already, and each later load reads them as a plain ``PretrainedConfig``: for a GGUF into
the config.json frame writes from its metadata (:mod:`frame.weights.gguf_config`), for a Hugging Face folder into
frame's cache (:func:`folder_config`). An engine serving either never imports the class's module.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frame.paths import cache_root

if TYPE_CHECKING:
    from transformers import PretrainedConfig

#: What the cache holds for a config a plain one cannot stand for (a class nesting other configs' classes, a
#: declared quantization, an unknown model type): the caller reads it through AutoConfig.
NOT_PLAIN = "frame_nests_configs"


def with_class_defaults_here(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as its transformers class holds it (defaults filled in), with each alias the class maps (GPT-2's
    ``hidden_size`` for ``n_embd``)."""
    from transformers import AutoConfig

    fields = dict(config)
    built = AutoConfig.for_model(fields.pop("model_type"), **fields)
    if getattr(type(built), "sub_configs", None):  # a text_config of its own class: a plain config cannot hold it
        return {NOT_PLAIN: True}
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


def folder_config(folder: Path) -> PretrainedConfig | None:
    """A Hugging Face folder's config.json as its class holds it, read as a plain config from frame's cache (written
    once per distinct config.json and transformers version, keyed by a sha256 digest of both); None, for the
    caller to use AutoConfig, where the class nests configs of other classes (a vision model's ``text_config``),
    the file declares a quantization (its ``quantization_config`` stays transformers' to read) or names no model
    type transformers knows."""
    import transformers

    raw = (folder / "config.json").read_bytes()
    key = hashlib.sha256(raw + transformers.__version__.encode()).hexdigest()[:24]
    cached = cache_root() / "configs" / f"{key}.json"
    if not cached.is_file():
        config = json.loads(raw)
        known = isinstance(config, dict) and isinstance(config.get("model_type"), str) and \
            "quantization_config" not in config and "auto_map" not in config
        try:
            full = with_class_defaults(config) if known else {NOT_PLAIN: True}
        except (RuntimeError, ValueError, KeyError):  # a model type this transformers does not know
            full = {NOT_PLAIN: True}
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = cached.with_name(f".{cached.name}.{os.getpid()}")
        staging.write_text(json.dumps(full))
        os.replace(staging, cached)  # a process reading the cache sees no file or a whole one
    data = json.loads(cached.read_text())
    return None if NOT_PLAIN in data else _plain(data)


def read_full_config(file: Path) -> PretrainedConfig:
    """A config.json :func:`with_class_defaults` wrote, as a plain ``PretrainedConfig`` (the class not imported)."""
    data = json.loads(file.read_text())
    if NOT_PLAIN in data:
        raise ValueError(f"{file} holds no plain config: its class nests configs of other classes")
    return _plain(data)


def _plain(data: dict[str, Any]) -> PretrainedConfig:
    from transformers import PretrainedConfig

    return PretrainedConfig.from_dict(data)


def concrete_config(config: PretrainedConfig) -> PretrainedConfig:
    """A plain config :func:`read_full_config` read, as an instance of its architecture's transformers class (for
    code that needs the class itself: transformers' own modules)."""
    from transformers import AutoConfig

    fields = config.to_dict()
    del fields["model_type"]  # to_dict writes the plain class's empty one; the instance keeps the file's
    return AutoConfig.for_model(config.model_type, **fields)
