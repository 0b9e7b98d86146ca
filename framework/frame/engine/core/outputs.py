"""What a request's step means to its client: an :class:`~frame.engine.wire.requests.EngineOutput`."""

from __future__ import annotations

from frame.engine.wire.plan import PromptLogprobs, RequestSample
from frame.engine.wire.requests import EngineOutput
from frame.sequence import Sequence


def engine_output(seq: Sequence, sample: RequestSample | None, count: int, final: bool) -> EngineOutput:
    """The first ``count`` tokens of ``sample`` (with their logprobs when asked for) for ``seq``'s client; on a
    ``final`` output, the reason it finished (``seq.status``) and the stop token that ended it, if one did. The
    prompt logprobs ``seq`` holds go out with its first tokens (and ``seq`` lets go of them)."""
    tokens = sample.token_ids[:count] if sample is not None else []
    logprobs = None
    if seq.params.logprobs is not None:
        logprobs = list(sample.logprobs[:count]) if sample is not None and sample.logprobs else []
    prompt_logprobs = None
    if seq.prompt_logprobs and tokens:
        prompt_logprobs, seq.prompt_logprobs = seq.prompt_logprobs, []
    return EngineOutput(
        request_id=seq.seq_id, new_token_ids=list(tokens), new_logprobs=logprobs,
        finish_reason=seq.status.value if final else None,
        stop_reason=seq.stop_reason if isinstance(seq.stop_reason, int) else None,
        num_prompt_tokens=seq.num_prompt_tokens, num_cached_tokens=seq.num_cached_tokens,
        prompt_logprobs=prompt_logprobs,
    )


def hold_prompt_logprobs(reported: list[PromptLogprobs], live: dict[str, Sequence]) -> None:
    """Keep a step's prompt logprobs on their sequences until a first token takes them to the client (those of a
    request that ended meanwhile are dropped)."""
    for chunk in reported:
        if (seq := live.get(chunk.req_id)) is not None:
            seq.prompt_logprobs.extend(chunk.logprobs)
