"""ResponseStore: bounded, least recently used out, and kept apart by tenant."""

from __future__ import annotations

from frame.server.response_store import ResponseStore
from frame.server.schemas import ChatMessage


def conversation(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=text)]


def test_the_least_recently_used_response_goes_first() -> None:
    store = ResponseStore(capacity=2)
    store.put(None, "a", conversation("a"))
    store.put(None, "b", conversation("b"))
    assert store.get(None, "a")[0].content == "a"  # a is now the most recently used
    store.put(None, "c", conversation("c"))
    assert len(store) == 2 and store.get(None, "b") is None
    assert store.get(None, "a") is not None and store.get(None, "c") is not None


def test_tenants_never_read_each_others_responses() -> None:
    store = ResponseStore()
    store.put("tenant-1", "r", conversation("secret"))
    assert store.get("tenant-2", "r") is None and store.get(None, "r") is None
    assert store.get("tenant-1", "r")[0].content == "secret"
