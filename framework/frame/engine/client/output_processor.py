"""OutputProcessor: the client side of the engine. Fans requests out, detokenises, applies stop strings.

Runs wherever the tokenizer lives (the API server's process, or the offline LLM's). A request with ``n``
completions becomes ``n`` engine sequences ``<request_id>-<i>``; their outputs are merged back here. A stop string
is found in the detokenised text, the text is cut there, and the sequence is reported for abort so the engine
frees its blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from frame.engine.client.detokenizer import IncrementalDetokenizer
from frame.engine.wire.requests import EngineOutput, EngineRequest, TokenLogprobs
from frame.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from frame.sampling_params import SamplingParams


@dataclass
class CompletionDelta:
    """What one engine output added to one completion: for streaming."""

    request_id: str
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class _Child:
    output: CompletionOutput
    detok: IncrementalDetokenizer
    held: str = ""  # text withheld because it might be the start of a stop string


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    children: list[_Child] = field(default_factory=list)
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None

    def result(self) -> RequestOutput:
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids,
                             [c.output for c in self.children], self.finished, self.num_cached_tokens,
                             self.prompt_logprobs)

    @property
    def finished(self) -> bool:
        return all(c.output.finished for c in self.children)


@dataclass
class Processed:
    """The outcome of :meth:`OutputProcessor.process`."""

    deltas: list[CompletionDelta] = field(default_factory=list)
    finished: list[RequestOutput] = field(default_factory=list)
    to_abort: list[str] = field(default_factory=list)


def child_id(request_id: str, index: int) -> str:
    return f"{request_id}-{index}"


class OutputProcessor:
    """Tracks in-flight requests for one client."""

    def __init__(self, tokenizer) -> None:  # type: ignore[no-untyped-def]
        self.tokenizer = tokenizer
        self._requests: dict[str, _Request] = {}
        self._by_child: dict[str, tuple[_Request, int]] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
            arrival_time: float, priority: int = 0, cache_salt: str | None = None) -> list[EngineRequest]:
        """Register a request; returns the engine requests (one per completion) to send to the engine core."""
        state = _Request(request_id, prompt, prompt_token_ids, params,
                         prompt_logprobs=None if params.prompt_logprobs is None else [None])
        engine_requests = []
        for i in range(params.n):
            # The prompt is the same for every completion: only the first scores it.
            child_params = msgspec.structs.replace(
                params, n=1, seed=None if params.seed is None else params.seed + i,
                prompt_logprobs=params.prompt_logprobs if i == 0 else None)
            state.children.append(_Child(
                CompletionOutput(i, logprobs=[] if params.logprobs is not None else None,
                                 cumulative_logprob=0.0 if params.logprobs is not None else None),
                IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens),
            ))
            cid = child_id(request_id, i)
            self._by_child[cid] = (state, i)
            engine_requests.append(EngineRequest(request_id=cid, prompt_token_ids=prompt_token_ids,
                                                 params=child_params, arrival_time=arrival_time,
                                                 priority=priority, cache_salt=cache_salt))
        self._requests[request_id] = state
        return engine_requests

    def child_ids(self, request_id: str) -> list[str]:
        state = self._requests.get(request_id)
        return [child_id(request_id, c.output.index) for c in state.children] if state else []

    def drop(self, request_id: str) -> None:
        """Forget a request (after an abort by the client)."""
        state = self._requests.pop(request_id, None)
        if state:
            for c in state.children:
                self._by_child.pop(child_id(request_id, c.output.index), None)

    def process(self, outputs: list[EngineOutput]) -> Processed:
        result = Processed()
        for out in outputs:
            entry = self._by_child.get(out.request_id)
            if entry is None:
                continue  # a sequence already finished here (stop string) whose abort crossed this output
            state, index = entry
            child = state.children[index]
            state.num_cached_tokens = max(state.num_cached_tokens, out.num_cached_tokens)
            if out.prompt_logprobs and state.prompt_logprobs is not None:
                state.prompt_logprobs.extend(self._position(item) for item in out.prompt_logprobs)
            delta = self._apply(state, child, out)
            result.deltas.append(delta)
            if delta.finish_reason is not None:
                self._by_child.pop(out.request_id, None)
                if out.finish_reason is None:
                    result.to_abort.append(out.request_id)
                if state.finished:
                    self._requests.pop(state.request_id, None)
                    result.finished.append(state.result())
        return result

    def _apply(self, state: _Request, child: _Child, out: EngineOutput) -> CompletionDelta:
        completion, params = child.output, state.params
        completion.token_ids.extend(out.new_token_ids)
        new_logprobs = self._logprobs(completion, out.new_logprobs) if out.new_logprobs is not None else None
        text = child.held + child.detok.add(out.new_token_ids)
        child.held = ""
        finish, stop_reason = out.finish_reason, out.stop_reason
        if params.stop:
            text, hit, child.held = self._cut_at_stop(completion.text, text, params, final=finish is not None)
            if hit is not None:
                finish, stop_reason = "stop", hit
                child.held = ""
        completion.text += text
        if finish is not None:
            completion.text += child.held
            text += child.held
            child.held = ""
            completion.finish_reason, completion.stop_reason = finish, stop_reason
        return CompletionDelta(state.request_id, completion.index, text, list(out.new_token_ids), new_logprobs,
                               finish, stop_reason)

    @staticmethod
    def _cut_at_stop(before: str, new: str, params: SamplingParams, final: bool) -> tuple[str, str | None, str]:
        """Split ``new`` into (text to emit, the stop string hit or None, text held back)."""
        window = before[-max(len(s) for s in params.stop):] + new
        offset = len(window) - len(new)
        best: tuple[int, str] | None = None
        for stop in params.stop:
            at = window.find(stop)
            if at != -1 and (best is None or at < best[0]):
                best = (at, stop)
        if best is not None:
            at, stop = best
            end = at + (len(stop) if params.include_stop_str_in_output else 0)
            return window[offset:max(offset, end)] if end >= offset else "", stop, ""
        if final:
            return new, None, ""
        # Hold back a suffix that could still grow into a stop string.
        hold = 0
        for stop in params.stop:
            for k in range(min(len(stop) - 1, len(new)), 0, -1):
                if window.endswith(stop[:k]):
                    hold = max(hold, k)
                    break
        return new[: len(new) - hold], None, new[len(new) - hold:]

    def _logprobs(self, completion: CompletionOutput, items: list[TokenLogprobs]) -> list[PositionLogprobs]:
        positions = [self._position(item) for item in items]
        if completion.cumulative_logprob is not None:
            for item in items:
                completion.cumulative_logprob += item.logprob
        if completion.logprobs is not None:
            completion.logprobs.extend(positions)
        return positions

    def _position(self, item: TokenLogprobs) -> PositionLogprobs:
        """One position's logprobs by token id: the chosen token first, then the top alternatives, ranked."""
        ranks = {tid: r for r, (tid, _) in enumerate(item.top, start=1)}
        pos: PositionLogprobs = {item.token_id: Logprob(item.logprob, ranks.get(item.token_id, item.rank),
                                                        self.tokenizer.decode([item.token_id]))}
        for tid, lp in item.top:
            if tid not in pos:
                pos[tid] = Logprob(lp, ranks[tid], self.tokenizer.decode([tid]))
        return pos
