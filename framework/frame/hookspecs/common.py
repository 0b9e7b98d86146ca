"""Hooks every plugin may implement, whatever its kind."""

from __future__ import annotations

from pydantic import BaseModel

from frame.hookspecs import hookspec


@hookspec
def frame_plugin_options() -> type[BaseModel] | None:
    """The pydantic model of this plugin's own options, or None when it takes none.

    Called by the core on the selected plugin (only) while building the engine config, before anything is
    created. Its fields are the keys of the kind's options section, in YAML and on the command line (``KEY=VALUE``,
    repeatable): ``platform_options`` (``--platform-opt``), ``attn_options`` (``--attn-opt``), ``cache_options``
    (``--cache-opt``), ``sched_options`` (``--sched-opt``), ``model_options`` (``--model-opt``),
    ``speculative_options`` (``--speculative-opt``), ``grammar_options`` (``--grammar-opt``),
    ``tool_parser_options`` (``--tool-parser-opt``, a ``frame serve`` setting), ``router_options``
    (``--router-opt``) and ``quantization_options`` (``--quantization-opt``); the kinds table in
    docs/plugins.md lists them. Workload plugins take no options model: each workload's own parameters are its
    options, ``params`` (``--workload-opt``, a ``frame bench`` setting) of its entry in an experiment file. A key
    the model does not declare is a config error naming the valid ones, whatever the model's own ``extra``
    setting; a model may name keys it used to take in a ``replaced_keys: ClassVar[dict[str, str]]`` (old key to
    what replaced it, e.g. ``"--kv-cache-memory (a byte size such as 4GiB)"``), and such a key's error names the
    replacement instead. The validated instance is passed to the plugin's ``create`` hook as
    ``options``. Since API 1.
    """
