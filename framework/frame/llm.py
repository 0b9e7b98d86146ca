"""LLM: the offline API, mirroring vLLM's (``LLM(...).generate(prompts, SamplingParams(...))``).

The engine core runs in this process; with ``data_parallel_size`` N, N engine cores run in child processes (or
Ray actors, with ``distributed_backend="ray"``) and a router plugin places each prompt. Prompts are text
(tokenised here), ``{"prompt_token_ids": [...]}`` dicts, or lists of either; ``chat`` applies the model's chat
template first.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console
from rich.progress import Progress

from frame.config import build_config, load_yaml
from frame.engine.client.output_processor import CompletionDelta, OutputProcessor
from frame.engine.core.engine_core import EngineCore
from frame.engine.wire.requests import EngineStats
from frame.errors import FrameUsageError
from frame.outputs import RequestOutput
from frame.plugins.registry import PluginRegistry
from frame.sampling_params import SamplingParams
from frame.summary import startup_summary

log = logging.getLogger("frame.llm")

if TYPE_CHECKING:
    from frame.engine.client.sync import DataParallelEngine

PromptType = str | dict[str, Any]
Message = dict[str, str]


class LLM:
    """An engine in this process. Keyword arguments are EngineConfig keys (``cache``, ``sched``, ``attn``, ...)."""

    def __init__(self, model: str | None = None, *, config: str | None = None,
                 registry: PluginRegistry | None = None, **engine_args: Any) -> None:
        self.config = build_config(load_yaml(config) if config else None, model=model, **engine_args)
        if self.config.data_parallel_size > 1:
            from frame.engine.client.sync import DataParallelEngine

            self.engine: EngineCore | DataParallelEngine = DataParallelEngine(self.config)
        else:
            self.engine = EngineCore(self.config, registry)
            if log.isEnabledFor(logging.INFO):
                from frame.engine.core.loop import ready_message

                log.info("%s", startup_summary(ready_message(self.engine, os.getpid()), self.config, "inproc"))
        self.processor = OutputProcessor(self.get_tokenizer())
        self._ids = itertools.count()

    def get_tokenizer(self):  # type: ignore[no-untyped-def]
        return self.engine.source.tokenizer

    def stats(self) -> EngineStats:
        """The engine's counters: prefix-cache hits, preemptions, peak KV blocks, ... (summed over data-parallel
        cores)."""
        return self.engine.stats()

    def shutdown(self) -> None:
        """Stop the engine's worker processes or actors now (they also stop when the LLM is garbage collected)."""
        self.engine.shutdown()

    # -- generation -------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: PromptType | Seq[PromptType],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
        priority: Seq[int] | None = None,
        cache_salt: str | Seq[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate completions for every prompt; returns one RequestOutput per prompt, in order."""
        items = [prompts] if isinstance(prompts, str | dict) else list(prompts)
        params = self._per_prompt(sampling_params or SamplingParams(), len(items), "sampling_params")
        priorities = self._per_prompt(list(priority) if priority is not None else 0, len(items), "priority")
        salts = self._per_prompt(cache_salt, len(items), "cache_salt")
        order = []
        for item, p, prio, salt in zip(items, params, priorities, salts, strict=True):
            text, ids = self._tokenize(item)
            rid = str(next(self._ids))
            order.append(rid)
            for req in self.processor.add(rid, text, ids, p, time.monotonic(), prio, salt):
                try:
                    self.engine.add_request(req)
                except FrameUsageError:
                    self._abort_all(order)
                    raise
        return self._run(order, use_tqdm)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> list[RequestOutput]:
        """Apply the chat template to one conversation (or a list of them) and generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.get_tokenizer()
        prompts = []
        for conv in conversations:
            ids = tokenizer.apply_chat_template(conv, add_generation_prompt=add_generation_prompt,
                                                chat_template=chat_template, tokenize=True, return_dict=False)
            prompts.append({"prompt_token_ids": list(ids)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, **kwargs)

    def stream(self, prompt: PromptType, sampling_params: SamplingParams | None = None) -> Iterator[CompletionDelta]:
        """Generate for one prompt, yielding text deltas as tokens arrive (what ``frame generate`` prints)."""
        text, ids = self._tokenize(prompt)
        rid = str(next(self._ids))
        for req in self.processor.add(rid, text, ids, sampling_params or SamplingParams(), time.monotonic()):
            self.engine.add_request(req)
        try:
            while self.engine.has_unfinished():
                processed = self.processor.process(self.engine.step())
                if processed.to_abort:
                    self.processor.process(self.engine.abort(processed.to_abort))
                yield from processed.deltas
        finally:
            self._abort_all([rid])

    # -- internals --------------------------------------------------------------------------------------
    @staticmethod
    def _per_prompt(value: Any, count: int, name: str) -> list[Any]:
        if isinstance(value, list | tuple):
            if len(value) != count:
                raise FrameUsageError(f"{name} has {len(value)} entries for {count} prompts; pass one or one each.",
                                      param=name)
            return list(value)
        return [value] * count

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, list(self.get_tokenizer()(prompt).input_ids)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if isinstance(prompt, dict) and "prompt" in prompt:
            return prompt["prompt"], list(self.get_tokenizer()(prompt["prompt"]).input_ids)
        raise FrameUsageError("A prompt must be text or a dict with 'prompt' or 'prompt_token_ids'.", param="prompt")

    def _abort_all(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.engine.abort(self.processor.child_ids(rid))
            self.processor.drop(rid)

    def _run(self, order: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        # Inference mode once for the whole run, not once a step (ModelRunner.execute).
        with Progress(console=Console(stderr=True), disable=not use_tqdm, transient=True) as progress, \
                torch.inference_mode():
            task = progress.add_task("generating", total=len(order))
            while self.engine.has_unfinished():
                processed = self.processor.process(self.engine.step())
                if processed.to_abort:
                    self.processor.process(self.engine.abort(processed.to_abort))
                for result in processed.finished:
                    done[result.request_id] = result
                    progress.advance(task)
        return [done[rid] for rid in order]
