"""NgramProposer: prompt lookup. The last n tokens, found earlier in the request, propose the tokens after them.

Copy-heavy requests (rewrite this text, edit this code, answer from this document) repeat long runs of their
prompt; when the text so far ends with n tokens that also occur earlier, the tokens that followed them there are a
cheap and often right guess for what comes next. Longer n-grams are tried first (a longer match is a better
predictor), the most recent occurrence wins, and no model runs at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from frame.interfaces.proposer import Proposal, ProposalRequest, Proposer
from pydantic import BaseModel, ConfigDict, Field, model_validator

_ITEM = np.dtype("<i4").itemsize


class NgramOptions(BaseModel):
    """Options of ``--speculative-proposer ngram`` (``--speculative-opt key=value``)."""

    model_config = ConfigDict(extra="forbid")

    min_n: int = Field(2, ge=1, le=32, description="shortest n-gram looked up (shorter ones match too often)")
    max_n: int = Field(4, ge=1, le=32, description="longest n-gram looked up (tried first)")

    @model_validator(mode="after")
    def _ordered(self) -> NgramOptions:
        if self.min_n > self.max_n:
            raise ValueError(f"min_n ({self.min_n}) must not exceed max_n ({self.max_n})")
        return self


def find_continuation(tokens: np.ndarray, n: int, count: int) -> list[int]:
    """Up to ``count`` tokens that followed the most recent earlier occurrence of ``tokens``' last ``n`` tokens.

    The search runs over the tokens' bytes (bytes.rfind, in C), keeping only matches that start on a token
    boundary; the suffix itself is excluded, so a match is always followed by at least one token.
    """
    if count < 1 or len(tokens) <= n:
        return []
    data = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
    pattern = data[len(data) - n * _ITEM:]
    end = len(data) - _ITEM  # a match must end before the last token, so that something follows it
    while True:
        found = data.rfind(pattern, 0, end)
        if found < 0:
            return []
        if found % _ITEM == 0:
            start = found // _ITEM + n
            return tokens[start : start + count].tolist()
        end = found + len(pattern) - 1  # misaligned: look further left


class NgramProposer(Proposer):
    """Prompt lookup over each request's own tokens; deterministic, so proposals carry no probabilities."""

    def __init__(self, num_speculative_tokens: int, options: NgramOptions | None = None) -> None:
        super().__init__(num_speculative_tokens)
        self.options = options or NgramOptions()

    def propose(self, requests: Sequence[ProposalRequest]) -> list[Proposal]:
        out = []
        for request in requests:
            drafts: list[int] = []
            for n in range(self.options.max_n, self.options.min_n - 1, -1):
                drafts = find_continuation(request.token_ids, n, request.max_tokens)
                if drafts:
                    break
            out.append(Proposal(drafts))
        return out
