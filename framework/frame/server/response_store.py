"""ResponseStore: the conversations of ``/v1/responses`` answers kept for ``previous_response_id``.

In memory and bounded: the most recently used :data:`MAX_STORED_RESPONSES` are kept, older ones are forgotten (a
request naming one gets a 404), and a restart forgets them all. Entries are keyed by the request's tenant (its API
key's digest when keys are tenants) as well as the id, so one tenant never continues another's conversation.
"""

from __future__ import annotations

from collections import OrderedDict

from frame.server.schemas import ChatMessage

#: How many stored responses the server keeps (least recently used first out).
MAX_STORED_RESPONSES = 512


class ResponseStore:
    """Conversations (input then output, as chat messages, instructions left out) by (tenant, response id)."""

    def __init__(self, capacity: int = MAX_STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[str | None, str], list[ChatMessage]] = OrderedDict()

    def get(self, tenant: str | None, response_id: str) -> list[ChatMessage] | None:
        """The stored conversation (marked most recently used), or None when it is unknown or forgotten."""
        key = (tenant, response_id)
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(self, tenant: str | None, response_id: str, messages: list[ChatMessage]) -> None:
        """Keep ``messages`` under the id, forgetting the least recently used past the capacity."""
        self._items[(tenant, response_id)] = messages
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
