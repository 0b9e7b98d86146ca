"""Field types of the request schemas: integers bounded to what the engine carries, text that is valid Unicode.

JSON allows integers of any size and strings with lone surrogates (``"\\ud800"``); neither survives the trip to
the engine (msgpack holds 64-bit integers, torch seeds 64 bits, UTF-8 has no surrogates), so both are refused
here, in the schema, with a 400 that names the field. The bounds also appear in ``/openapi.json``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, JsonValue
from pydantic_core import PydanticCustomError

from frame.sampling_params import MAX_LOGPROBS

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1
#: Deepest nesting of lists and objects a ``chat_template_kwargs`` value may have.
MAX_JSON_DEPTH = 16


def check_unicode(value: Any) -> Any:
    """Refuse a string that holds a lone surrogate (valid JSON, but not text that UTF-8 can carry)."""
    if not isinstance(value, str):
        return value  # the type check that follows refuses it
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise PydanticCustomError(
            "invalid_unicode", "the text holds a lone surrogate at character {position}, which is not valid Unicode; "
            "send UTF-8 text", {"position": err.start}) from None
    return value


def _check_json(value: Any, depth: int = 0) -> None:
    if depth > MAX_JSON_DEPTH:
        raise PydanticCustomError("too_deep", "values may nest at most {limit} levels deep",
                                  {"limit": MAX_JSON_DEPTH})
    if isinstance(value, str):
        check_unicode(value)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_unicode(key)
            _check_json(item, depth + 1)


def check_template_values(values: dict[str, Any] | None) -> dict[str, Any] | None:
    """Plain JSON values only, not too deep, valid Unicode throughout."""
    if values is not None:
        _check_json(values)
    return values


def integral(value: Any) -> Any:
    """JSON Schema counts ``1.0`` as an integer, and so does this server; ``1.5`` and ``true`` stay refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Checked before pydantic's own string validation, whose message for a surrogate names no fix.
Text = Annotated[str, BeforeValidator(check_unicode)]
NonEmptyText = Annotated[str, Field(min_length=1), BeforeValidator(check_unicode)]
Count = Annotated[int, Field(ge=1, le=INT32_MAX), BeforeValidator(integral)]
NonNegative = Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(integral)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(integral)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
#: What ``torch.Generator.manual_seed`` and msgpack both hold; completion ``i`` of ``n`` uses ``seed + i``.
Seed = Annotated[int, Field(ge=INT64_MIN, le=UINT64_MAX), BeforeValidator(integral)]
Priority = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX), BeforeValidator(integral)]
#: vLLM's convention: ``-1`` (or ``0``) turns top-k off.
TopK = Annotated[int, Field(ge=-1, le=INT32_MAX), BeforeValidator(integral)]
Logprobs = Annotated[int, Field(ge=0, le=MAX_LOGPROBS), BeforeValidator(integral)]
TemplateKwargs = Annotated[dict[Text, JsonValue], AfterValidator(check_template_values)]
