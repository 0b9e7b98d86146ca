"""The start-up summary: one block, logged at info once the engine is ready, that says what runs.

It answers what a newcomer and a vLLM user look for in the first minute: which model and family, in which dtype
and quantization, on which platform and ISA path, with which attention backend, KV-cache strategy and scheduler,
over how many ranks and with which router, and how big the KV pool is: its dtype and bytes per token, in GiB, in
tokens, and as the number of requests of the full context length it holds at once (vLLM's "maximum concurrency").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ByteSize

from frame.config import EngineConfig

if TYPE_CHECKING:
    from frame.engine.wire.client_core import Ready



def kv_tokens(ready: Ready) -> int:
    """Tokens one core's KV pool holds."""
    return ready.num_blocks * ready.block_size


def max_concurrency(ready: Ready, data_parallel_size: int = 1) -> float:
    """Requests of ``max_model_len`` tokens each that all cores' pools hold at once."""
    return kv_tokens(ready) * data_parallel_size / ready.max_model_len


def pool_size(ready: Ready) -> str:
    """The pool's bytes as ``--kv-cache-memory`` spells a size (``1.9GiB``, ``512.0MiB``)."""
    return ByteSize(ready.kv_bytes).human_readable()


def kv_bytes_per_token(ready: Ready) -> int:
    """Bytes one token's K and V take in the pool, over all layers (a quantized pool's scales included)."""
    return ready.kv_bytes // max(kv_tokens(ready), 1)


def kv_dtype_line(ready: Ready) -> str:
    """The pool's dtype and its bytes per token (``int8 (8-bit codes + a float32 scale per token and KV head),
    12240 bytes per token``)."""
    quantized = " (8-bit codes + a float32 scale per token and KV head)" if ready.kv_dtype in ("int8", "fp8") else ""
    return f"{ready.kv_dtype or ready.dtype}{quantized}, {kv_bytes_per_token(ready)} bytes per token"


def pool_sizing(config: EngineConfig) -> str:
    """What sized the KV pool, as the KV pool row's tail."""
    if config.num_kv_blocks is not None:
        return "set by --num-kv-blocks"
    if config.kv_cache_memory is not None:
        return f"set by --kv-cache-memory {config.kv_cache_memory.human_readable()}"
    return "the platform's share of free memory (--kv-cache-memory sets it)"


def _long_prefills(config: EngineConfig) -> str:
    """The long-prefill cap, as the scheduler row's tail ('' when there is none)."""
    cap = config.long_prefill_tokens
    return f", a long prefill {cap} of them while others run or wait" if cap else ""


def startup_summary(ready: Ready, config: EngineConfig, mode: str) -> str:
    """The summary block for an engine built from ``config`` that reported ``ready`` (its first core's report,
    when there are several: they are built alike)."""
    dp, tp = config.data_parallel_size, config.tensor_parallel_size
    cores = f"{dp} engine core{'s' if dp > 1 else ''} ({mode}, pid {ready.pid}{' of rank 0' if dp > 1 else ''})"
    router = f"router {config.router}" if dp > 1 else "no router (one core)"
    quantization = (f"{ready.quantization} (weights kept packed)" if ready.quantization
                    else f"none (dense {ready.dtype} weights)")
    prefix = "no prefix caching" if ready.cache == "none" else "prefix caching on"
    if not config.cuda_graphs:
        graphs = "off (--enforce-eager / --no-cuda-graphs)"
    elif ready.decode_graphs:
        when = ", all recorded at start" if config.record_graphs_at_start else ""
        graphs = f"on, {len(ready.decode_graphs)} batch sizes up to {max(ready.decode_graphs)}{when}"
    else:
        graphs = ("none recorded here (the platform's option, the attention backend or tensor parallelism); "
                  "decode steps run eagerly")
    rows = [
        ("model", f"{ready.model_name} (family {ready.family}, max_model_len {ready.max_model_len})"),
        ("dtype", ready.dtype),
        ("quantization", quantization),
        ("platform", ready.platform),
        ("ISA path", ready.isa_path or "torch's own kernels"),
        ("attention", ready.attn),
        ("cache", f"{ready.cache} ({prefix}), block size {ready.block_size}"),
        ("scheduler", f"{ready.sched}, at most {config.max_num_seqs} sequences and {config.max_num_batched_tokens} "
                      f"tokens a step{_long_prefills(config)}"),
        ("ranks", f"{cores} x {tp} tensor-parallel rank{'s' if tp > 1 else ''}; {router}"),
        ("KV pool", f"{pool_size(ready)}{' per rank' if tp > 1 else ''}, {kv_tokens(ready)} tokens "
                    f"({ready.num_blocks} blocks) per core; {pool_sizing(config)}"),
        ("KV dtype", kv_dtype_line(ready)),
        ("max concurrency", f"{max_concurrency(ready, dp):.2f} requests of {ready.max_model_len} tokens at once"),
        ("decode graphs", graphs),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(["frame is ready:", *(f"  {name:<{width}}  {value}" for name, value in rows)])
