"""The small endpoints: models, tokenize, detokenize, health, version, metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from frame.engine.mp import EngineDeadError
from frame.errors import FrameUsageError
from frame.server.chat import apply_template
from frame.server.checks import check_model, check_token_ids
from frame.server.deps import get_state, tokenize_text
from frame.server.errors import error_response
from frame.server.schemas import DetokenizeRequest, TokenizeRequest
from frame.server.state import ServerState
from frame.version import __version__

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    """200 while the engine runs; 503 while starting, after the engine died, or while draining."""
    state: ServerState | None = getattr(request.app.state, "frame", None)
    if state is None:
        return error_response("The engine is starting.", 503, "starting")
    if not state.client.healthy:
        return error_response(f"The engine is not running: {state.client.dead_reason}.", 503, "engine_dead")
    if state.draining:
        return error_response("The server is shutting down.", 503, "server_draining")
    return JSONResponse({"status": "ok"})


@router.get("/version")
async def version(state: ServerState = Depends(get_state)) -> dict[str, Any]:
    return {"version": __version__, "engine_mode": state.client.mode, "engine_pid": state.client.pid}


@router.get("/v1/models")
async def models(state: ServerState = Depends(get_state)) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": state.created, "owned_by": "frame", "root": state.info.model_name,
         "max_model_len": state.info.max_model_len} for name in state.model_names]}


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, state: ServerState = Depends(get_state)) -> dict[str, Any]:
    check_model(req.model, state.model_names)
    if (req.prompt is None) == (req.messages is None):
        raise FrameUsageError("Send exactly one of prompt or messages.", param="prompt")
    if req.messages is not None:
        ids = apply_template(state, req.messages, req.add_generation_prompt)
    elif req.add_special_tokens:
        ids = tokenize_text(state, req.prompt or "")
    else:
        ids = list(state.tokenizer(req.prompt or "", add_special_tokens=False).input_ids)
    return {"count": len(ids), "max_model_len": state.info.max_model_len, "tokens": ids}


@router.post("/detokenize")
async def detokenize(req: DetokenizeRequest, state: ServerState = Depends(get_state)) -> dict[str, Any]:
    check_model(req.model, state.model_names)
    check_token_ids(req.tokens, state.info.vocab_size, "tokens")
    return {"prompt": state.tokenizer.decode(req.tokens)}


@router.get("/metrics")
async def metrics(state: ServerState = Depends(get_state)) -> Response:
    try:
        stats = await state.client.stats() if state.client.healthy else None
    except (EngineDeadError, asyncio.TimeoutError):
        stats = None
    return Response(state.metrics.render(stats), media_type=CONTENT_TYPE_LATEST)
