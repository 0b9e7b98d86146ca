"""Server and IPC pieces without a running server: the message codec, the server's checks, error mapping, and an
engine process that fails to start."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgspec
import pytest
from frame.config import build_config
from frame.engine.client import EngineDeadError, make_client
from frame.engine.wire.client_core import (
    AbortRequests,
    AddRequests,
    FromEngine,
    Outputs,
    Ready,
    ToEngine,
)
from frame.engine.wire.codec import decode, encode
from frame.engine.wire.requests import EngineOutput, EngineRequest, TokenLogprobs
from frame.errors import InvalidSamplingError, PromptTooLongError
from frame.sampling_params import SamplingParams
from frame.server.checks import check_cache_salt, check_length, check_model
from frame.server.errors import ServerError


def test_messages_round_trip_as_a_tagged_union():
    req = EngineRequest(request_id="r-0", prompt_token_ids=[1, 2, 3], arrival_time=1.5, cache_salt="s",
                        params=SamplingParams(temperature=0.5, stop=["x"], logprobs=2, seed=3))
    assert decode(encode(AddRequests([req])), ToEngine) == AddRequests([req])
    assert decode(encode(AbortRequests(["a", "b"])), ToEngine) == AbortRequests(["a", "b"])
    out = Outputs([EngineOutput(request_id="r-0", new_token_ids=[5], finish_reason="stop",
                                new_logprobs=[TokenLogprobs(5, -0.1, [(5, -0.1), (6, -2.0)])])])
    assert decode(encode(out), FromEngine) == out
    ready = Ready(pid=1, max_model_len=1024, vocab_size=49152, num_blocks=8, model_name="m")
    assert decode(encode(ready), FromEngine) == ready
    with pytest.raises(msgspec.ValidationError):
        decode(encode(ready), ToEngine)  # an engine->client message is not a client->engine one
    with pytest.raises(msgspec.DecodeError):
        decode(b"\x80\x04not msgpack", ToEngine)


def test_decoding_validates_sampling_params():
    bad = msgspec.msgpack.encode({"type": "add", "requests": [
        {"request_id": "r", "prompt_token_ids": [1], "arrival_time": 0.0, "params": {"temperature": -1.0}}]})
    with pytest.raises(InvalidSamplingError):
        decode(bad, ToEngine)


@pytest.mark.parametrize(("n", "max_tokens"), [(0, 4), (5, 20), (16, 1), (30, None), (10, 6)])
def test_check_length_matches_the_engine_core(n, max_tokens):
    from frame.engine.core.engine_core import EngineCore

    req = EngineRequest(request_id="r", prompt_token_ids=list(range(n)), arrival_time=0.0,
                        params=SamplingParams(max_tokens=max_tokens))
    core_error = server_error = None
    try:
        EngineCore.check_request(SimpleNamespace(max_model_len=16, max_speculative_tokens=0), req)  # type: ignore[arg-type]
    except PromptTooLongError as err:
        core_error = (str(err), err.param)
    try:
        check_length(n, max_tokens, 16)
    except PromptTooLongError as err:
        server_error = (str(err), err.param)
    assert core_error == server_error
    assert (core_error is None) == (n + (max_tokens or 1) <= 16 and n > 0)


@pytest.mark.parametrize("salt", ["", "x" * 257, "tab\there", "nul\x00"])
def test_bad_cache_salts(salt):
    with pytest.raises(InvalidSamplingError) as err:
        check_cache_salt(salt)
    assert err.value.param == "cache_salt"


def test_good_cache_salt_and_model():
    check_cache_salt("tenant-42 ünïcode")
    check_model(None, ["a"])
    with pytest.raises(ServerError) as err:
        check_model("b", ["a"])
    assert err.value.status == 404 and "serves: a" in err.value.message


def test_engine_process_that_cannot_start_reports_why(tmp_path):
    config = build_config(model=str(tmp_path))  # exists, but is no model

    async def start() -> None:
        client = make_client("mp", config)
        try:
            await client.start(timeout_s=120)
        finally:
            await client.shutdown()

    with pytest.raises(EngineDeadError, match=r"config\.json"):
        asyncio.run(start())
