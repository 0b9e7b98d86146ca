"""``frame bench perplexity``: how much a dtype or a quantization costs in accuracy, on a fixed text.

The text ships with frame (``texts/declaration.txt``: the Declaration of Independence, the Gettysburg Address and
Lincoln's second inaugural address, all public domain). It is cut into chunks of ``n_ctx`` tokens as llama.cpp's
``perplexity`` tool cuts it: each chunk is evaluated on its own from an empty cache, its first token replaced by
BOS when the tokenizer adds one, and only its second half is scored (each scored token then has at least
``n_ctx / 2`` tokens of context). The perplexity is ``exp`` of the mean negative log-likelihood of the scored
tokens. :func:`chunks` is shared with ``benchmarks/compare_llamacpp.py``, so llama.cpp scores the very same ids.

The model runs as the engine runs it: a model worker with the config's platform, dtype, attention backend,
quantization and platform kernels; each chunk is one prefill through the paged KV cache.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from frame.config import EngineConfig

TEXT = Path(__file__).parent / "texts" / "declaration.txt"


@dataclass(frozen=True)
class Perplexity:
    """One system's score: ``exp(nll / tokens)`` over ``tokens`` scored tokens in ``chunks`` chunks."""

    label: str
    perplexity: float
    nll: float
    tokens: int
    chunks: int
    seconds: float
    #: Bytes one token's K and V take in the KV pool (``--kv-cache-dtype``; a quantized pool's scales included).
    kv_bytes_per_token: int = 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def token_ids(tokenizer: Any, text: str | None = None) -> list[int]:
    """The shipped text (or ``text``) as token ids, without special tokens."""
    return list(tokenizer(text if text is not None else TEXT.read_text(), add_special_tokens=False)["input_ids"])


def chunks(ids: Sequence[int], n_ctx: int, bos_id: int | None) -> list[list[int]]:
    """Whole chunks of ``n_ctx`` ids (the remainder is dropped), each starting with ``bos_id`` when given."""
    if n_ctx < 4:
        raise ValueError(f"n_ctx must be at least 4, not {n_ctx}")
    out = []
    for start in range(0, len(ids) - n_ctx + 1, n_ctx):
        chunk = list(ids[start : start + n_ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        out.append(chunk)
    if not out:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than one chunk of {n_ctx}")
    return out


def bos_of(tokenizer: Any) -> int | None:
    """The BOS id when the tokenizer puts one before a text (llama.cpp then starts every chunk with it)."""
    adds = getattr(tokenizer, "add_bos_token", False)
    return tokenizer.bos_token_id if adds and tokenizer.bos_token_id is not None else None


def score(logits: torch.Tensor, chunk: Sequence[int]) -> tuple[float, int]:
    """Negative log-likelihood of the chunk's second half given ``logits`` ``[n_ctx, vocab]``, and its count."""
    first = len(chunk) // 2
    targets = torch.tensor(chunk[first + 1 :], dtype=torch.long)
    logprobs = torch.log_softmax(logits[first:-1].double(), dim=-1)
    return float(-logprobs.gather(1, targets[:, None]).sum()), len(targets)


class Prefiller:
    """A model worker for ``config`` that runs one sequence of at most ``n_ctx`` ids at a time, from an empty cache,
    as one prefill through the paged KV cache, and returns every position's logits."""

    def __init__(self, config: EngineConfig, n_ctx: int) -> None:
        from frame.engine.worker.model_worker import Worker

        self.config, self.n_ctx = config, n_ctx
        self.worker = Worker(config, max_model_len=n_ctx)
        self.tokenizer = self.worker.source.tokenizer
        self.blocks = math.ceil(n_ctx / config.block_size)
        self.worker.runner.allocate_kv(self.blocks)

    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        """float32 logits ``[len(ids), vocab]`` on the CPU: row ``i`` predicts the id after ``ids[i]``."""
        from frame.testing.attention import build_metadata

        if not 0 < len(ids) <= self.n_ctx:
            raise ValueError(f"a sequence of {len(ids)} ids does not fit n_ctx {self.n_ctx}")
        runner, device = self.worker.runner, self.worker.selection.platform.device
        table = list(range(self.blocks))
        with torch.inference_mode():
            meta = runner.attention.build_metadata(build_metadata([0], [len(ids)], [table], self.config.block_size,
                                                                  device))
            hidden = runner.model(torch.tensor(list(ids), device=device), torch.arange(len(ids), device=device),
                                  runner.kv_caches, meta)
            return runner.model.compute_logits(hidden).float().cpu()


def frame_perplexity(config: EngineConfig, label: str, n_ctx: int, max_chunks: int | None = None,
                     text: str | None = None) -> Perplexity:
    """Perplexity of the model ``config`` describes, run by a model worker as the engine runs it, over the first
    ``max_chunks`` chunks (default: all) of the shipped text (or ``text``)."""
    model = Prefiller(config, n_ctx)
    pieces = chunks(token_ids(model.tokenizer, text), n_ctx, bos_of(model.tokenizer))[:max_chunks]
    nll, count = 0.0, 0
    started = time.perf_counter()
    for chunk in pieces:
        part, scored = score(model.logits(chunk), chunk)
        nll, count = nll + part, count + scored
    return Perplexity(label, math.exp(nll / count), nll, count, len(pieces), time.perf_counter() - started,
                      model.worker.runner.bytes_per_block // config.block_size)


def default_variants(config: EngineConfig) -> list[str]:
    """float32, bfloat16 where the platform computes it, and float32 with each installed quantization that
    serves the model."""
    from frame.engine.selection import select, select_quantization
    from frame.errors import FrameUsageError
    from frame.model_source import ModelSource
    from frame.plugins.hooks import PluginHooks
    from frame.plugins.registry import PluginRegistry

    hooks = PluginHooks(PluginRegistry())
    platform = select(config.model_copy(update={"dtype": "auto"}), hooks).platform
    variants = ["float32"] + (["bfloat16"] if torch.bfloat16 in platform.supported_dtypes else [])
    source = ModelSource.open(config.model, config.tokenizer, config.trust_remote_code)
    for name in hooks.registry.names("quantization"):
        try:
            select_quantization(hooks, config.model_copy(update={"quantization": name}), source)
        except FrameUsageError:
            continue
        variants.append(f"float32+{name}")
    return variants


def run_variants(config: EngineConfig, variants: Sequence[str] | None, n_ctx: int, console: Any,
                 max_chunks: int | None = None, text: str | None = None) -> list[Perplexity]:
    """Score each variant (``DTYPE[+QUANTIZATION][@KV_DTYPE]``) of ``config``'s model in turn, in this process;
    ``@int8`` runs that variant with ``--kv-cache-dtype int8`` (without it, the config's KV dtype applies)."""
    from frame.errors import ConfigError

    results = []
    for variant in variants or default_variants(config):
        weights, _, kv_dtype = variant.partition("@")
        dtype, _, quantization = weights.partition("+")
        try:
            varied = config.model_copy(update={"dtype": dtype, "quantization": quantization or "none",
                                               "kv_cache_dtype": kv_dtype or config.kv_cache_dtype})
            EngineConfig.model_validate(varied.model_dump())
        except ValueError as err:
            raise ConfigError(f"--variant {variant}: {err}", param="variant") from None
        console.print(f"scoring {variant} ...")
        results.append(frame_perplexity(varied, variant, n_ctx, max_chunks, text))
    return results


def render(results: Sequence[Perplexity], console: Any, text_name: str = TEXT.name) -> None:
    """A table of the results, each relative to the first."""
    from rich.table import Table

    table = Table(title=f"perplexity on {text_name}")
    for column in ("system", "perplexity", f"vs {results[0].label}", "KV bytes/token", "scored tokens", "chunks",
                   "seconds"):
        table.add_column(column, justify="left" if column == "system" else "right")
    for r in results:
        ratio = r.perplexity / results[0].perplexity
        table.add_row(r.label, f"{r.perplexity:.4f}", f"{(ratio - 1) * 100:+.2f}%", str(r.kv_bytes_per_token),
                      str(r.tokens), str(r.chunks), f"{r.seconds:.1f}")
    console.print(table)
