"""Stop rules: whether a request is finished after its latest token (the engine applies them, not policies)."""

from __future__ import annotations

from frame.sequence import Sequence, SequenceStatus


def stop_status(seq: Sequence, max_model_len: int) -> tuple[SequenceStatus, int | None] | None:
    """The finished status ``seq`` reached with its last token, or None; the second item is the stop token.

    In order: an end-of-sequence token (unless ``ignore_eos``) or a stop token id, once ``min_tokens`` are out;
    ``max_tokens``; the model's context length. Stop strings are matched on text by the client, which aborts.
    """
    params = seq.params
    last = seq.output_token_ids[-1]
    if seq.num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and last in seq.eos_token_ids:
            return SequenceStatus.FINISHED_STOPPED, last
        if last in params.stop_token_ids:
            return SequenceStatus.FINISHED_STOPPED, last
    if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
        return SequenceStatus.FINISHED_LENGTH, None
    if seq.num_tokens >= max_model_len:
        return SequenceStatus.FINISHED_LENGTH, None
    return None
