"""``/openapi.json`` that says what the server does, so a client (or a fuzzer) can trust it.

FastAPI documents a 422 for every route with a body; this server answers such requests 400 in the OpenAI error
shape, so the 422s and their schemas go and every status a route can answer is documented with that shape: 400
(validation, limits), 401 (when keys are configured), 404 (unknown model), 408 and 413 (body time and size), 429
(per-client and per-key caps), 431 (header size), 503 (starting, restarting, draining, overloaded), in Anthropic's
shape on the Messages API's routes. The generation routes also stream ``text/event-stream``, and ``/metrics`` is
Prometheus text. The operator's limits (``n``, ``max_tokens``, ``logprobs``, the stop list) appear as each field's
maximum, the vocabulary as every token id's, the served names as ``model``'s values, the sampling ranges, and the
field this server refuses unless empty (``suffix``) as empty.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from frame.server.auth import OPEN_PATHS
from frame.server.errors import ANTHROPIC_PREFIX
from frame.server.messages_schemas import CountTokensRequest, MessagesRequest
from frame.server.responses_schemas import ResponsesRequest
from frame.server.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from frame.server.settings import ServerSettings

_ERROR_SCHEMA = {
    "type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
_WHY = {400: "The request is malformed, out of range or over a limit.", 401: "No API key, or a wrong one.",
        404: "The model is not served here.", 408: "The body did not arrive in time.",
        413: "The body is over the size limit.",
        429: "This client address has too many connections, or this API key too many requests in flight; retry.",
        431: "The request line and headers are over the size limit.",
        503: "Starting, restarting, draining or overloaded; retry."}
_STREAMING = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages")
#: Anthropic's error shape, which the Messages API's routes answer in.
_ANTHROPIC_ERROR_SCHEMA = {
    "type": "object", "required": ["type", "error"], "properties": {"type": {"const": "error"}, "error": {
        "type": "object", "required": ["type", "message"], "properties": {
            "type": {"type": "string"}, "message": {"type": "string"}}}}}
#: One server-sent event (what tools such as schemathesis check each event against): its data is a JSON chunk,
#: an error in the OpenAI shape, or the final ``[DONE]``.
_SSE_EVENT = {"type": "object", "required": ["data"],
              "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}
_WITH_MODEL = (*_STREAMING, "/tokenize", "/detokenize", "/v1/messages/count_tokens", "/v1/models/{model_id}")
#: The request bodies whose schemas are pydantic's own, narrowed to this server's limits.
_BODIES = (CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest, ResponsesRequest,
           MessagesRequest, CountTokensRequest)
#: Fields the server refuses unless empty; the schema accepts them only so, as the server does.
_ONLY_EMPTY = {"suffix": {"maxLength": 0}}
#: The ranges SamplingParams checks (a test holds the two together), for the schema to say them too.
SAMPLING_RANGES = {
    "temperature": {"minimum": 0, "maximum": 100}, "top_p": {"exclusiveMinimum": 0, "maximum": 1},
    "min_p": {"minimum": 0, "maximum": 1}, "presence_penalty": {"minimum": -2, "maximum": 2},
    "frequency_penalty": {"minimum": -2, "maximum": 2}, "repetition_penalty": {"exclusiveMinimum": 0, "maximum": 2},
}


def _statuses(path: str, method: str, settings: ServerSettings) -> list[int]:
    statuses = [413, 429, 431, 503]
    if method == "post":
        statuses += [400, 408]
    if path in _WITH_MODEL:
        statuses.append(404)
    if settings.api_keys and path not in OPEN_PATHS:
        statuses.append(401)
    return sorted(statuses)


def _cap(schema: dict[str, Any], field: str, key: str, limit: int) -> None:
    """Set ``key`` (maximum, maxItems) to ``limit`` wherever field's schema (or one of its shapes) has it."""
    prop = schema.get("properties", {}).get(field)
    for shape in [prop, *(prop or {}).get("anyOf", [])] if prop else []:
        if key in shape or (key == "maxItems" and shape.get("type") == "array"):
            shape[key] = min(shape.get(key, limit), limit)


def _cap_token_ids(schema: Any, vocab_size: int) -> None:
    """Every integer array item (a token id) below ``vocab_size``, however deep in ``anyOf`` and ``items``."""
    if isinstance(schema, dict):
        items = schema.get("items")
        if isinstance(items, dict) and items.get("type") == "integer":
            items["maximum"] = vocab_size - 1
        for value in schema.values():
            _cap_token_ids(value, vocab_size)
    elif isinstance(schema, list):
        for value in schema:
            _cap_token_ids(value, vocab_size)


def _apply_limits(components: dict[str, Any], settings: ServerSettings, vocab_size: int | None,
                  model_names: list[str] | None) -> None:
    limits = settings.limits
    if vocab_size is not None:
        props = components["CompletionRequest"]["properties"]
        for schema in (props["prompt"], props["stop_token_ids"], components["ChatCompletionRequest"]["properties"][
                "stop_token_ids"], components["DetokenizeRequest"]["properties"]["tokens"]):
            _cap_token_ids(schema, vocab_size)
    for body in _BODIES:
        schema = components[body.__name__]
        rules = {**_ONLY_EMPTY, **SAMPLING_RANGES, "model": {"enum": model_names} if model_names else {}}
        for field, rule in rules.items():
            prop = schema["properties"].get(field, {})
            for shape in [prop, *prop.get("anyOf", [])]:
                if shape.get("type") not in (None, "null"):
                    shape.update(rule)
        _cap(schema, "n", "maximum", limits.max_n)
        _cap(schema, "stop", "maxItems", limits.max_stop)
        for field in ("logprobs", "top_logprobs"):
            _cap(schema, field, "maximum", limits.max_logprobs)
        if limits.max_tokens is not None:
            for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
                _cap(schema, field, "maximum", limits.max_tokens)


def build_schema(app: FastAPI, settings: ServerSettings, vocab_size: int | None = None,
                 model_names: list[str] | None = None) -> dict[str, Any]:
    """The OpenAPI document; ``vocab_size`` and ``model_names`` (known once the engine runs) narrow it further."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for model in _BODIES:
        # pydantic's own schema: FastAPI's OpenAPI models turn integer bounds into floats (2**64 - 1 would
        # round up to 2**64, a seed this server refuses).
        own = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(own.pop("$defs", {}))
        components[model.__name__] = own
    components["ErrorResponse"] = _ERROR_SCHEMA
    components["AnthropicErrorResponse"] = _ANTHROPIC_ERROR_SCHEMA
    _apply_limits(components, settings, vocab_size, model_names)
    for path, operations in schema["paths"].items():
        shape = "AnthropicErrorResponse" if path.startswith(ANTHROPIC_PREFIX) else "ErrorResponse"
        error = {"application/json": {"schema": {"$ref": f"#/components/schemas/{shape}"}}}
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status in _statuses(path, method, settings):
                responses[str(status)] = {"description": _WHY[status], "content": error}
            ok = responses.setdefault("200", {"description": "OK"}).setdefault("content", {})
            if path in _STREAMING:
                ok["text/event-stream"] = {"schema": _SSE_EVENT}
            elif path == "/metrics":
                ok.clear()
                ok["text/plain"] = {"schema": {"type": "string"}}
    return schema


def install_openapi(app: FastAPI, settings: ServerSettings) -> None:
    """Serve :func:`build_schema` as ``/openapi.json``; built once the engine is up, when the vocabulary is known."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        state = getattr(app.state, "frame", None)
        if state is None:  # still starting: the schema without what only the engine knows
            return build_schema(app, settings)
        app.openapi_schema = build_schema(app, settings, state.info.vocab_size, state.model_names)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
