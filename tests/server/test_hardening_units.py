"""The hardening pieces without a running server: the engine client's codec check, the engine loop that outlives a
request it cannot take, paths kept out of error messages, the schema's sampling ranges against SamplingParams, and
docs/serving.md against the flags of `frame serve`."""

from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path

import pytest
from frame.config import build_config
from frame.engine.client import make_client
from frame.engine.core.loop import EngineLoop
from frame.engine.wire.client_core import AddRequests, Rejected
from frame.engine.wire.requests import EngineRequest
from frame.errors import FrameUsageError, InvalidSamplingError
from frame.sampling_params import SamplingParams
from frame.server.errors import without_paths
from frame.server.openapi import SAMPLING_RANGES

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _request(**params) -> EngineRequest:
    return EngineRequest(request_id="r-0", prompt_token_ids=[1, 2], arrival_time=0.0, params=SamplingParams(**params))


@pytest.mark.parametrize("mode", ["mp", "inproc"])
def test_a_message_the_engine_cannot_decode_never_leaves_the_client(mode):
    client = make_client(mode, build_config())  # never started: add() must refuse before sending anything
    try:
        with pytest.raises(FrameUsageError, match="cannot be sent to the engine"):
            client.add([_request(seed=2**64)])
    finally:
        asyncio.run(client.shutdown())


def test_the_engine_loop_rejects_a_request_it_cannot_add_and_goes_on():
    class Core:
        structured = None  # no constrained requests here

        def add_request(self, req: EngineRequest) -> None:
            if req.request_id == "bad-0":
                raise TypeError("not a token id")
            self.added = req.request_id

    sent: list[object] = []
    loop = EngineLoop(Core(), sent.append)  # type: ignore[arg-type]
    bad = EngineRequest(request_id="bad-0", prompt_token_ids=[1], arrival_time=0.0, params=SamplingParams())
    assert loop.handle(AddRequests([bad, _request()]))
    assert sent == [Rejected("bad-0", "The engine could not add this request.", 500, "internal_error")]
    assert loop.core.added == "r-0"


@pytest.mark.parametrize(("message", "expected"), [
    ("the engine failed: FileNotFoundError: /root/.cache/frame/gguf/abc/tokenizer.json",
     "the engine failed: FileNotFoundError: <path>"),
    ("No such file: '/tmp/frame-engine-x/input'", "No such file: '<path>'"),
    ("cannot read ~/.cache/frame/x.json now", "cannot read <path> now"),
    ("This model has no chat template; use /v1/completions.", "This model has no chat template; use /v1/completions."),
    ("see /tokenize and http://127.0.0.1:8000/v1/models", "see /tokenize and http://127.0.0.1:8000/v1/models"),
])
def test_error_messages_carry_no_paths(message, expected):
    assert without_paths(message) == expected


@pytest.mark.parametrize("field", sorted(SAMPLING_RANGES))
def test_the_schema_sampling_ranges_are_sampling_params_own(field):
    def accepts(value: float) -> bool:
        try:
            SamplingParams(**{field: value})
        except InvalidSamplingError:
            return False
        return True

    rule, eps = SAMPLING_RANGES[field], 1e-9
    if "minimum" in rule:
        assert accepts(rule["minimum"]) and not accepts(rule["minimum"] - eps)
    if "exclusiveMinimum" in rule:
        assert not accepts(rule["exclusiveMinimum"]) and accepts(rule["exclusiveMinimum"] + eps)
    assert accepts(rule["maximum"]) and not accepts(rule["maximum"] + eps)


def _serve_flags() -> list[argparse.Action]:
    from frame.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    engine = {a.dest for g in parser._action_groups if g.title == "engine" for a in g._group_actions}
    return [a for a in parser._actions if a.option_strings and a.dest not in engine and a.dest != "help"]


def test_every_serve_flag_is_in_serving_md_with_its_default():
    rows = [line.split("|")[1:3] for line in (DOCS / "serving.md").read_text().splitlines() if line.startswith("| `")]
    for action in _serve_flags():
        flag = action.option_strings[0]
        row = next((r for r in rows if re.search(rf"`{re.escape(flag)}[` /]", r[0])), None)
        assert row is not None, f"{flag} is missing from the tables of docs/serving.md"
        if isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
            numbers = [float(n) for n in re.findall(r"\d+(?:\.\d+)?", row[1].replace(",", ""))]
            assert float(action.default) in numbers, f"{flag}: docs/serving.md does not give {action.default}"


def test_a_client_is_its_api_key_where_the_server_has_keys_else_its_address():
    """The per-client caps inside handlers (request templates) count a keyed request by its key, whatever address
    it comes from, and a request to a keyless server by its address."""
    from frame.server.auth import ApiKeyMiddleware, client_of

    seen: list[str] = []

    async def app(scope, receive, send):
        seen.append(client_of(scope))

    async def call(guard, key: str, address: str) -> None:
        scope = {"type": "http", "path": "/v1/chat/completions", "client": (address, 5000),
                 "headers": [(b"authorization", f"Bearer {key}".encode())]}
        await guard(scope, None, None)

    guard = ApiKeyMiddleware(app, ["k-one", "k-two"], salt_by_key=False)
    asyncio.run(call(guard, "k-two", "10.0.0.1"))
    asyncio.run(call(guard, "k-two", "10.0.0.2"))
    assert seen == ["key 1", "key 1"]
    assert client_of({"type": "http", "client": ("10.0.0.3", 5000)}) == "address 10.0.0.3"
