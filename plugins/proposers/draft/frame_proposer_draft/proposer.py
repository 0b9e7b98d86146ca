"""DraftProposer: a smaller model of the same tokenizer runs ahead of the target, token by token.

Each step it catches up on the tokens the target emitted since its last call (the drafts the target kept and the
target's own token), rewinding its KV past the drafts the target rejected, then decodes up to k tokens greedily,
all requests in one batch per token. Greedy drafts are deterministic, so proposals carry no probabilities and
verification treats them as certain guesses: the output distribution is still exactly the target's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from frame.interfaces.proposer import Proposal, ProposalRequest, Proposer
from pydantic import BaseModel, ConfigDict, Field


class DraftOptions(BaseModel):
    """Options of ``--speculative-proposer draft`` (``--speculative-opt key=value``)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="the draft checkpoint (HF folder or .gguf); default: the bundled "
                                                "SmolLM2-135M-Instruct")
    num_blocks: int = Field(2048, ge=1, description="KV blocks of the draft's own pool; requests that find none "
                                                    "are not drafted for")


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class DraftProposer(Proposer):
    """Drafts with a :class:`~frame.engine.worker.drafting.DraftModel` (from the context's ``load_draft_model``);
    ``inputs[req]`` are the tokens whose KV it holds."""

    def __init__(self, num_speculative_tokens: int, draft: Any) -> None:
        super().__init__(num_speculative_tokens)
        self.draft = draft
        self.inputs: dict[str, np.ndarray] = {}

    def propose(self, requests: Sequence[ProposalRequest]) -> list[Proposal]:
        drafts: dict[str, list[int]] = {r.req_id: [] for r in requests}
        active: list[tuple[str, np.ndarray]] = []
        for request in requests:
            if request.max_tokens < 1:
                continue
            known = self.inputs.get(request.req_id, request.token_ids[:0])
            keep = min(common_prefix(known, request.token_ids), len(request.token_ids) - 1)
            self.draft.rewind(request.req_id, keep)
            if not self.draft.reserve(request.req_id, len(request.token_ids) + request.max_tokens):
                self.forget(request.req_id)  # no room in the draft's pool: this request goes undrafted
                continue
            active.append((request.req_id, request.token_ids[keep:]))
            self.inputs[request.req_id] = request.token_ids.copy()
        limits = {r.req_id: r.max_tokens for r in requests}
        while active:
            tokens = self.draft.extend(active).argmax(dim=-1).tolist()
            next_round = []
            for (req_id, _), token in zip(active, tokens, strict=True):
                drafts[req_id].append(int(token))
                if len(drafts[req_id]) < limits[req_id]:
                    next_round.append((req_id, [int(token)]))
                    self.inputs[req_id] = np.append(self.inputs[req_id], np.int32(token))
            active = next_round
        return [Proposal(drafts[r.req_id]) for r in requests]

    def forget(self, req_id: str) -> None:
        self.inputs.pop(req_id, None)
        self.draft.drop(req_id)
