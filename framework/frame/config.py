"""EngineConfig: one pydantic model for every engine setting, from a YAML file and CLI flags (flags win).

Plugins contribute their own options through ``frame_plugin_options``; those live in the per-kind sections
``platform_options``, ``attn_options``, ``cache_options``, ``sched_options`` and ``model_options`` and are
validated against the selected plugin's model once the plugin is known (:func:`resolve_plugin_options`).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from frame.errors import ConfigError

#: ``half`` and ``float`` are vLLM's spellings of float16 and float32; the config keeps the canonical name.
DType = Literal["auto", "float32", "bfloat16", "float16", "half", "float"]
DTYPE_ALIASES = {"half": "float16", "float": "float32"}


class EngineConfig(BaseModel):
    """Every setting of one engine. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str | None = Field(None, description="HF folder, .gguf file or Hub id (org/name); default: bundled "
                              "SmolLM2-135M-Instruct")
    tokenizer: str | None = Field(None, description="tokenizer folder, when it differs from the model")
    dtype: DType = Field("auto", description="weights, activations and KV dtype; auto: the platform's choice")
    kv_cache_dtype: Literal["auto", "bfloat16", "float32", "float16", "int8", "fp8"] = Field(
        "auto", description="KV cache dtype: auto (the model's dtype), a float dtype, or int8 / fp8 (e4m3) codes with "
        "a float32 scale per token and KV head (about half of bfloat16's bytes); the attention backend must support "
        "it (frame plugins lists which)")
    max_model_len: int | None = Field(None, ge=16, description="longest sequence (prompt + output), at most the "
                                      "model's; default: the model's")
    block_size: int = Field(16, ge=1, le=1024, description="tokens per KV block")
    kv_cache_memory: ByteSize | None = Field(
        None, description="the KV pool's size (per rank), a byte size: 2GiB, 512MB, 1.5G or bytes; default: the "
        "platform's share of free memory (cpu: half of the RAM available once the weights are loaded, as vLLM-CPU's "
        "VLLM_CPU_KVCACHE_SPACE sets KV space aside), within kv_cache_fraction")
    num_kv_blocks: int | None = Field(None, ge=1, description="KV pool size in blocks; overrides kv_cache_memory and "
                                      "kv_cache_fraction")
    kv_cache_fraction: float = Field(0.9, gt=0.0, le=1.0, description="share of the device's memory (of RAM on a "
                                     "CPU) the weights and the KV pool may take together (vLLM's "
                                     "--gpu-memory-utilization)")
    max_num_seqs: int = Field(256, ge=1, description="most sequences running at once")
    # 4096 as vLLM's offline CPU default: on the mixed-batch benchmark it ran 3% faster than 2048 (fewer, fuller
    # steps). Serving, with requests arriving while others decode, 2048 is faster (frame.cli.serve).
    max_num_batched_tokens: int = Field(4096, ge=1, description="token budget of one step (frame serve: 2048 unless "
                                        "set, with chunked prefill on)")
    enable_chunked_prefill: bool = Field(True, description="prefill long prompts over several steps")
    long_prefill_token_threshold: int | None = Field(
        None, ge=0, description="while other requests run or wait, a prefill of more than this many tokens computes "
        "at most this many per step, so short requests are admitted and decode beside it (vLLM's flag); default: "
        "max_num_batched_tokens / 16; 0: no cap")
    max_long_partial_prefills: int | None = Field(
        None, ge=1, description="most prompts longer than long_prefill_token_threshold prefilled at once; shorter ones "
        "pass a long prompt that waits for its turn (vLLM's flag); default: no limit")
    num_continuous_decode_steps: int = Field(
        1, ge=1, le=64, description="decode steps a batch of decodes runs back to back in one engine step while no "
        "request waits (SGLang's flag): the scheduler and the engine's Python run once for them, which a single "
        "stream on a CPU spends several percent of each token on; a request that arrives meanwhile waits for them")
    platform: str = Field("auto", description="platform plugin; auto: the best available")
    attn: str = Field("auto", description="attention plugin; auto: the platform's choice")
    cache: str = Field("hashchain", description="KV-cache strategy plugin")
    sched: str = Field("fcfs", description="scheduler plugin")
    platform_options: dict[str, Any] = Field(default_factory=dict, description="options of the platform plugin")
    attn_options: dict[str, Any] = Field(default_factory=dict, description="options of the attention plugin")
    cache_options: dict[str, Any] = Field(default_factory=dict, description="options of the cache plugin")
    sched_options: dict[str, Any] = Field(default_factory=dict, description="options of the scheduler plugin")
    model_options: dict[str, Any] = Field(default_factory=dict,
                                          description="options of the model family that builds the checkpoint")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="ranks each layer's heads and rows are split over")
    distributed_backend: Literal["mp", "ray"] = Field(
        "mp", description="how model workers run with tensor_parallel_size > 1: mp (one process each) or ray (actors)")
    ray_address: str | None = Field(
        None, description="Ray cluster to join with distributed_backend ray ('auto': the running one); default: a "
        "local Ray started on demand ($RAY_ADDRESS when set)")
    data_parallel_size: int = Field(
        1, ge=1, le=1024, description="engine cores behind one server, each with its own scheduler, KV-cache "
        "strategy and KV pool (and its own tensor_parallel_size ranks); a router plugin places each request")
    data_parallel_rank: int = Field(
        0, ge=0, description="this engine core's data-parallel rank: frame sets it for each core it starts (it picks "
        "the core's devices, or its share of the CPU cores); leave it 0")
    router: str = Field("round_robin", description="router plugin that places requests on data-parallel cores")
    router_options: dict[str, Any] = Field(default_factory=dict, description="options of the router plugin")
    cuda_graphs: bool = Field(
        True, description="replay recorded decode steps where the platform records graphs (CUDA graphs on cuda, "
        "a native program of the step's op calls on cpu) and the attention backend allows it; off: every step runs "
        "eagerly")
    record_graphs_at_start: bool = Field(
        False, description="record every decode bucket while the engine starts, as vLLM captures its CUDA graphs, "
        "where the platform would record each on its first use instead (cpu: 35-100 ms a bucket up to 32 rows, "
        "about 4 s for SmolLM2's 20 buckets up to 256); frame serve's default is on, so its first clients do not "
        "pay the recordings (default elsewhere: off)")
    speculative_proposer: str | None = Field(
        None, description="speculative-decoding proposer plugin (ngram, draft, ...); default: no speculation")
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="most draft tokens proposed per request and step")
    speculative_options: dict[str, Any] = Field(default_factory=dict, description="options of the proposer plugin")
    # vLLM's speculative `disable_by_batch_size`. On a CPU a full batch is compute-bound, so verifying drafts costs
    # as much as the tokens they save: the 64-request mixed batch ran 14% slower with ngram drafting throughout.
    speculative_disable_by_batch_size: int | None = Field(
        8, ge=1, description="no drafts while more requests than this decode at once (None: always draft)")
    grammar_backend: str = Field("xgrammar", description="structured-output grammar backend plugin (requests' "
                                 "response_format / structured_outputs)")
    grammar_options: dict[str, Any] = Field(default_factory=dict, description="options of the grammar backend")
    grammar_cache_bytes: int = Field(
        512 << 20, ge=0, description="bytes of compiled grammars the engine keeps for reuse, least recently used "
        "evicted first (a 20,000-branch regex holds tens of megabytes)")
    reserved_cores: int | None = Field(
        None, ge=0, description="cores an engine in its own process (frame serve) leaves to the API server: its "
        "affinity excludes them, so its compute threads never contend with the server's event loop; default: 1 "
        "where every engine process (one per data-parallel core) keeps at least 4 cores after it, else 0 (on 2 cores a "
        "reserved core cost the engine a third of its served throughput; vLLM's CPU backend always reserves one)")
    quantization: str | None = Field(
        None, description="quantization plugin that keeps the linear weights quantized (gguf: a GGUF's blocks kept "
        "packed; int8: per output channel; none: dense weights); default: the checkpoint's quantization_config, "
        "else gguf for a .gguf file where the platform has ggml kernels, else dense weights")
    quantization_options: dict[str, Any] = Field(default_factory=dict, description="options of the quantization "
                                                 "plugin")
    tool_parser: str | None = Field(None, description="tool-call parser plugin of frame serve for chat "
                                    "completions with tool_choice auto (default there: hermes), checked with the "
                                    "engine's plugins at start; other commands parse no calls")
    tool_parser_options: dict[str, Any] = Field(default_factory=dict, description="options of the tool-call parser "
                                                "plugin (frame serve's --tool-parser; other commands parse no calls)")
    seed: int = Field(0, description="seed of unseeded sampling")
    trust_remote_code: bool = Field(False, description="allow a checkpoint's own Python code (off unless asked)")

    @field_validator("dtype", mode="after")
    @classmethod
    def _canonical_dtype(cls, value: str) -> str:
        return DTYPE_ALIASES.get(value, value)

    @field_validator("kv_cache_memory", mode="before")
    @classmethod
    def _byte_size(cls, value: Any) -> Any:
        if value is None:
            return None
        try:
            size = TypeAdapter(ByteSize).validate_python(value)
        except ValidationError:
            size = None
        if size is None or size <= 0:
            raise PydanticCustomError("byte_size", "{value} is not a byte size above 0; give one such as 2GiB, "
                                      "512MB or 1073741824", {"value": repr(value)})
        return size

    @model_validator(mode="after")
    def _rank_within_size(self) -> EngineConfig:
        if self.data_parallel_rank >= self.data_parallel_size:
            raise ValueError(f"data_parallel_rank ({self.data_parallel_rank}) must be below data_parallel_size "
                             f"({self.data_parallel_size}); leave data_parallel_rank to frame")
        return self

    @model_validator(mode="after")
    def _budget_fits_a_sequence(self) -> EngineConfig:
        if not self.enable_chunked_prefill and self.max_model_len and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_model_len "
                f"({self.max_model_len}) when chunked prefill is off"
            )
        return self

    @property
    def long_prefill_tokens(self) -> int:
        """``long_prefill_token_threshold`` with its default resolved (0 without chunked prefill: nothing is cut)."""
        if not self.enable_chunked_prefill:
            return 0
        if self.long_prefill_token_threshold is None:
            return max(1, self.max_num_batched_tokens // 16)
        return self.long_prefill_token_threshold


#: The per-kind option sections of EngineConfig, by plugin kind.
OPTION_SECTIONS = {"platform": "platform_options", "attention": "attn_options", "cache": "cache_options",
                   "scheduler": "sched_options", "proposer": "speculative_options", "grammar": "grammar_options",
                   "router": "router_options", "model": "model_options",
                   "quantization": "quantization_options", "tool_parser": "tool_parser_options"}
#: ``speculative: {proposer: ngram, num_speculative_tokens: 4, options: {...}}`` in a config file, flattened.
SPECULATIVE_SECTION = {"proposer": "speculative_proposer", "num_speculative_tokens": "num_speculative_tokens",
                       "options": "speculative_options",
                       "disable_by_batch_size": "speculative_disable_by_batch_size"}


def unknown_key_error(key: str, model: type[BaseModel], where: str = "config") -> ConfigError:
    """One sentence naming an unknown key, the closest valid one and every valid one."""
    valid = list(model.model_fields)
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], valid, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return ConfigError(f"Unknown {where} key '{key}'; {hint}valid keys: {', '.join(valid) or '(none)'}.", param=key)


def config_error(err: ValidationError, model: type[BaseModel], where: str = "config") -> ConfigError:
    """Turn pydantic's report into one sentence naming the key and, for unknown keys, the valid ones."""
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        return unknown_key_error(key, model, where)
    return ConfigError(f"Invalid {where} value for '{key}': {first['msg']}.", param=key)


def _accepted_keys(model: type[BaseModel]) -> set[str]:
    """Field names and their string aliases: the keys a plugin's options model reads."""
    keys = set(model.model_fields)
    for field in model.model_fields.values():
        keys.update(a for a in (field.alias, field.validation_alias) if isinstance(a, str))
    return keys


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a dict; a missing file or a non-mapping is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"Config file {p} does not exist; pass an existing YAML file to --config.", param="config")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {p} must hold a mapping of keys to values.", param="config")
    return data


def build_config(file_values: dict[str, Any] | None = None, **flags: Any) -> EngineConfig:
    """Merge a config file's values with flags (flags that are None are not given and do not override)."""
    merged = _flatten_speculative(dict(file_values or {}))
    for key, value in flags.items():
        if value is None:
            continue
        if key in OPTION_SECTIONS.values() and isinstance(value, dict):
            merged[key] = {**merged.get(key, {}), **value}
        else:
            merged[key] = value
    try:
        return EngineConfig(**merged)
    except ValidationError as err:
        raise config_error(err, EngineConfig) from None


def _flatten_speculative(values: dict[str, Any]) -> dict[str, Any]:
    """A ``speculative:`` mapping becomes the ``speculative_*`` keys (one name per setting, as the flags have)."""
    section = values.pop("speculative", None)
    if section is None:
        return values
    if not isinstance(section, dict):
        raise ConfigError("The config key 'speculative' must be a mapping with proposer, num_speculative_tokens and "
                          "options.", param="speculative")
    for key, value in section.items():
        if key not in SPECULATIVE_SECTION:
            raise ConfigError(f"Unknown config key 'speculative.{key}'; valid keys: "
                              f"{', '.join(SPECULATIVE_SECTION)}.", param=f"speculative.{key}")
        values[SPECULATIVE_SECTION[key]] = value
    return values


def resolve_plugin_options(
    kind: str, name: str, values: dict[str, Any], options_model: type[BaseModel] | None
) -> BaseModel | None:
    """Validate a plugin's option values against its options model.

    Keys the model does not declare are refused whatever the model's own ``extra`` setting, so a misspelled
    option never passes silently. An old key the model names in its ``replaced_keys`` class attribute (old key
    to what replaced it) is refused with a pointer to its replacement instead of the list of valid keys.
    """
    if options_model is None:
        if values:
            raise ConfigError(
                f"The {kind} plugin '{name}' takes no options, but got: {', '.join(values)}.",
                param=OPTION_SECTIONS.get(kind),
            )
        return None
    unknown = [key for key in values if key not in _accepted_keys(options_model)]
    replaced: dict[str, str] = getattr(options_model, "replaced_keys", {})
    for key in unknown:
        if key in replaced:
            raise ConfigError(f"The {kind} '{name}' option '{key}' was replaced by {replaced[key]}; set that "
                              f"instead and drop '{key}'.", param=key)
    if unknown:
        raise unknown_key_error(unknown[0], options_model, where=f"{kind} '{name}' option")
    try:
        return options_model(**values)
    except ValidationError as err:
        raise config_error(err, options_model, where=f"{kind} '{name}' option") from None


def parse_key_values(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    """``["a=1", "b=x"]`` from repeated ``--<kind>-opt`` flags into a dict, values parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} expects key=value, got '{pair}'.", param=flag)
        out[key.strip()] = yaml.safe_load(value)
    return out
