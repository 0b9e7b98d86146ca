"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}`` with the right status.

Every way a request can go wrong maps here: frame's usage errors (their ``status``, ``param`` and ``code``),
pydantic's validation errors and malformed JSON (400, as OpenAI and vLLM answer, not FastAPI's 422), HTTP errors
(unknown route 404, wrong method 405) and a dead engine (503). The Messages API's routes answer the same errors
in Anthropic's shape.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from frame.engine.client import EngineDeadError
from frame.errors import FrameUsageError

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable_error"}
#: FastAPI's answer when parsing the body raised something other than a JSON syntax error: in practice a
#: RecursionError, Python's json parser recursing once per level of nesting.
_UNPARSED = "There was an error parsing the body"
UNPARSED_BODY = ("The request body nests arrays and objects deeper than this server's JSON parser goes (Python's "
                 "recursion limit, about 1,000 levels; each field has a lower bound of its own); send a flatter body.")
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 408: "request_timeout", 413: "request_too_large"}
#: Tags pydantic puts in an error's location for the members of a union; never field names here.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
_FIELD = re.compile(r"[a-z_][a-z0-9_]*")
#: An absolute filesystem path of two or more parts (``/root/.cache/frame/x``); API routes (``/v1/...``) stay.
_FS_PATH = re.compile(r"(?<![\w.:/~-])~?/(?!v1/)(?:[^\s/'\"`:,;()<>\[\]]+/)+[^\s/'\"`:,;()<>\[\]]*")


class ClientDisconnectedError(Exception):
    """The HTTP client went away before its response was ready (answered 499, which nobody reads)."""


class ServerError(FrameUsageError):
    """A request the server refuses for its own reasons (auth, limits, load); ``status`` set per instance."""

    def __init__(self, message: str, *, status: int, code: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message, param=param)
        self.status, self.code, self.headers = status, code, headers or {}


def without_paths(message: str) -> str:
    """The message with filesystem paths replaced by ``<path>``: clients learn nothing of the host's layout."""
    return _FS_PATH.sub("<path>", message)


def error_body(message: str, status: int, code: str | None, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error shape; every error a client sees is built here."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": without_paths(message), "type": kind, "param": param, "code": code}}


def error_response(message: str, status: int, code: str | None, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, code, param), status_code=status, headers=headers)


#: Routes that answer in Anthropic's shape (the Messages API); every other route answers in OpenAI's.
ANTHROPIC_PREFIX = "/v1/messages"
_ANTHROPIC_TYPES = {"service_unavailable_error": "overloaded_error", "server_error": "api_error"}


def anthropic_body(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI error body in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``."""
    error = body["error"]
    kind = _ANTHROPIC_TYPES.get(error["type"], error["type"])
    if error.get("code") == "request_too_large":
        kind = "request_too_large"
    return {"type": "error", "error": {"type": kind, "message": error["message"]}}


def shaped(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` in the shape the route at ``path`` speaks."""
    return anthropic_body(body) if path.startswith(ANTHROPIC_PREFIX) else body


def _reply(request: Request, body: dict[str, Any], status: int,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(shaped(request.url.path, body), status_code=status, headers=headers)


def usage_error_body(err: FrameUsageError) -> dict[str, Any]:
    return error_body(err.message, err.status, err.code, err.param)


def dead_engine_body(err: EngineDeadError) -> dict[str, Any]:
    return error_body(str(err), 503, "engine_dead")


def _is_field(part: int | str) -> bool:
    """A location part that names a field or an index, not a union member's tag ('str', 'list[int]', ...)."""
    return isinstance(part, int) or (part not in _TYPE_TAGS and _FIELD.fullmatch(part) is not None)


def _path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc if p != "body" and _is_field(p))


def _is_type_error(error: dict[str, Any]) -> bool:
    return str(error.get("type", "")).endswith("_type")


def validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    """One sentence (and the param) from pydantic's list of errors.

    A field with several accepted shapes (``prompt``: text, token ids, or lists of either) fails once per shape;
    the error of the first failing field that says most is reported: a value error (too short, out of range, bad
    Unicode) over a wrong type, and the deepest one.
    """
    errors = err.errors()
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"The request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}.", None
    path = _path(first.get("loc", ()))
    if not path and first.get("type") in ("model_attributes_type", "dict_type", "missing"):
        return "The request body must be a JSON object.", None
    field = path.split(".")[0]
    same = [e for e in errors if _path(e.get("loc", ())).split(".")[0] == field]
    chosen = max([e for e in same if not _is_type_error(e)] or same, key=lambda e: len(_path(e.get("loc", ()))))
    path, message = _path(chosen.get("loc", ())), chosen["msg"]
    if _is_type_error(chosen):  # every shape refused the type: say which shapes would do
        shapes = dict.fromkeys(e["msg"].removeprefix("Input should be ") for e in same if _path(e["loc"]) == path)
        message = "Input should be " + " or ".join(shapes)
    if chosen.get("type") == "extra_forbidden":
        return f"Unknown parameter '{path}'; remove it.", path
    if chosen.get("type") == "missing":
        return f"'{path}' is required.", path
    return f"Invalid value for '{path}': {message}.", path or None


def install_error_handlers(app: FastAPI) -> None:
    """Answer every failure in the OpenAI error shape (Anthropic's under :data:`ANTHROPIC_PREFIX`)."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, err: RequestValidationError) -> JSONResponse:
        message, param = validation_message(err)
        return _reply(request, error_body(message, 400, "invalid_json" if param is None else "invalid_value", param),
                      400)

    @app.exception_handler(ServerError)
    async def _server(request: Request, err: ServerError) -> JSONResponse:
        return _reply(request, error_body(err.message, err.status, err.code, err.param), err.status, err.headers)

    @app.exception_handler(FrameUsageError)
    async def _usage(request: Request, err: FrameUsageError) -> JSONResponse:
        return _reply(request, usage_error_body(err), err.status)

    @app.exception_handler(ClientDisconnectedError)
    async def _gone(_: Request, __: ClientDisconnectedError) -> Response:
        return Response(status_code=499)

    @app.exception_handler(EngineDeadError)
    async def _dead(request: Request, err: EngineDeadError) -> JSONResponse:
        state = getattr(request.app.state, "frame", None)
        retry = str(state.settings.retry_after_s) if state is not None else "1"
        return _reply(request, dead_engine_body(err), 503, {"Retry-After": retry})

    @app.exception_handler(HTTPException)
    async def _http(request: Request, err: HTTPException) -> JSONResponse:
        if err.status_code == 400 and err.detail == _UNPARSED:
            return _reply(request, error_body(UNPARSED_BODY, 400, "invalid_json"), 400)
        return _reply(request, error_body(str(err.detail), err.status_code, _HTTP_CODES.get(err.status_code)),
                      err.status_code, getattr(err, "headers", None))
