"""The reference system: Hugging Face transformers' own ``generate`` on the same weights and prompts.

Prompts run in batches (left padding), greedy, exactly ``max_tokens`` new tokens each. ``ignore_eos`` is
mimicked by generating with no end-of-sequence token at all: generation then neither stops nor masks the EOS
logit, which is what frame (and vLLM) do with ``ignore_eos``, so greedy tokens stay comparable one to one.
Requests of different output lengths go in separate batches. Waves are ignored: every prompt is known up front.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

from frame.bench.hf_export import export_folder
from frame.bench.metrics import RequestTiming
from frame.interfaces.workload import WorkloadRequest
from frame.model_source import ModelSource


class _FirstTokenClock(StoppingCriteria):
    """Records when generate produced its first token, and counts steps; never stops anything."""

    def __init__(self, on_step: Callable[[], None] | None) -> None:
        self.first: float | None = None
        self.on_step = on_step

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if self.first is None:
            self.first = time.perf_counter()
        if self.on_step is not None:
            self.on_step()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class TransformersBaseline:
    """A transformers model loaded from the checkpoint frame uses, and a timed batched greedy generate."""

    def __init__(self, source: ModelSource, dtype: torch.dtype) -> None:
        # A GGUF loads from its Hugging Face export (transformers' own dequantisation, written once).
        kwargs = {} if source.is_gguf else {"trust_remote_code": source.trust_remote_code}
        self.model = AutoModelForCausalLM.from_pretrained(export_folder(source, dtype), dtype=dtype, **kwargs).eval()
        self.tokenizer = source.tokenizer
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(source.eos_token_ids or {0})
        self.eos_ids = sorted(source.eos_token_ids)

    @torch.inference_mode()
    def _generate(self, prompts: Sequence[Sequence[int]], max_tokens: int, ignore_eos: bool,
                  clock: _FirstTokenClock) -> list[list[int]]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
            temperature=None, top_p=None, top_k=None, pad_token_id=self.pad_id,
            eos_token_id=None if ignore_eos else self.eos_ids, stopping_criteria=StoppingCriteriaList([clock]),
        )
        return [row[width:].tolist() for row in out]

    def run(self, requests: Sequence[WorkloadRequest], batch_size: int,
            on_tokens: Callable[[int], None] | None = None) -> tuple[list[RequestTiming], float]:
        """Generate for every request; returns per-request timings (in request order) and the wall time."""
        groups: dict[tuple[int, bool], list[int]] = {}
        for index, req in enumerate(requests):
            groups.setdefault((req.params.max_tokens or 16, req.params.ignore_eos), []).append(index)
        timings: dict[int, RequestTiming] = {}
        start = time.perf_counter()
        for (max_tokens, ignore_eos), indices in groups.items():
            for at in range(0, len(indices), batch_size):
                batch = indices[at:at + batch_size]
                prompts = [requests[i].prompt_token_ids for i in batch]
                clock = _FirstTokenClock((lambda n=len(batch): on_tokens(n)) if on_tokens else None)
                outputs = self._generate(prompts, max_tokens, ignore_eos, clock)
                done = time.perf_counter()
                for i, output in zip(batch, outputs, strict=True):
                    if not ignore_eos:
                        output = _cut_at_eos(output, self.eos_ids, self.pad_id)
                    timings[i] = RequestTiming(len(requests[i].prompt_token_ids), start, clock.first, done, output)
        return [timings[i] for i in range(len(requests))], time.perf_counter() - start


def _cut_at_eos(tokens: list[int], eos_ids: Sequence[int], pad_id: int) -> list[int]:
    for pos, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[:pos + 1]
    return tokens
