"""The small endpoints: models, tokenize, detokenize, health, version, metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from frame.engine.client import EngineDeadError
from frame.errors import FrameUsageError
from frame.server.checks import check_model, check_token_ids
from frame.server.deps import get_state
from frame.server.errors import error_response
from frame.server.schemas import DetokenizeRequest, TokenizeRequest
from frame.server.state import ServerState
from frame.version import __version__

router = APIRouter()
#: Served only with ``--enable-reset-prefix-cache`` (vLLM serves its twin only in its dev mode).
cache_router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    """200 while an engine core serves, with each core's state (``ok``, ``starting``, ``down``) by data-parallel
    rank and the chat-template workers (``size``, ``missing``); ``status`` is ``degraded`` while some core is not
    serving or some template worker is being replaced. 503 while starting, restarting, draining or when no core
    serves. It needs no key, so it says which part is down, never why (the log says that)."""
    state: ServerState | None = getattr(request.app.state, "frame", None)
    if state is None or not state.ready:
        return error_response("The server is not ready to serve.", 503, "unavailable",
                              headers={"Retry-After": str(state.settings.retry_after_s if state else 1)})
    ranks, pool = state.client.rank_states(), state.prompts.pool
    status = "ok" if all(r.status == "ok" for r in ranks) and not pool.short else "degraded"
    return JSONResponse({"status": status, "ranks": [{"rank": r.rank, "status": r.status} for r in ranks],
                         "render_workers": {"size": pool.size, "missing": pool.short}})


@router.get("/version")
async def version(state: ServerState = Depends(get_state)) -> dict[str, Any]:
    """The version, the engine form, and each engine core's process id by data-parallel rank."""
    return {"version": __version__, "engine_mode": state.client.mode, "engine_pid": state.client.pid,
            "ranks": [{"rank": r.rank, "status": r.status, "pid": r.pid} for r in state.client.rank_states()]}


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": state.created, "owned_by": "frame",
            "root": state.info.model_name, "max_model_len": state.info.max_model_len}


@router.get("/v1/models")
async def models(state: ServerState = Depends(get_state)) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(state, name) for name in state.model_names]}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, state: ServerState = Depends(get_state)) -> dict[str, Any]:
    """One served model's card; 404 (OpenAI shape) for a name this server does not serve."""
    check_model(model_id, state.model_names)
    return _model_card(state, model_id)


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, state: ServerState = Depends(get_state)) -> dict[str, Any]:
    check_model(req.model, state.model_names)
    if (req.prompt is None) == (req.messages is None):
        raise FrameUsageError("Send exactly one of prompt or messages.", param="prompt")
    if req.messages is not None:
        ids = await state.prompts.chat(req.messages, req.add_generation_prompt)
    else:
        ids = (await state.prompts.encode([req.prompt or ""], add_special_tokens=req.add_special_tokens))[0]
    return {"count": len(ids), "max_model_len": state.info.max_model_len, "tokens": ids}


@router.post("/detokenize")
async def detokenize(req: DetokenizeRequest, state: ServerState = Depends(get_state)) -> dict[str, Any]:
    check_model(req.model, state.model_names)
    check_token_ids(req.tokens, state.info.vocab_size, "tokens")
    return {"prompt": await state.prompts.decode(req.tokens)}


@cache_router.post("/reset_prefix_cache")
async def reset_prefix_cache(state: ServerState = Depends(get_state)) -> dict[str, bool]:
    """Empty every engine core's prefix cache, so a benchmark's next run starts cold. ``success`` is false where a
    core still had requests holding blocks (it keeps its cache then). The reset and the stats read after it travel
    the same ordered channel, so the stats show whether each core did it."""
    before = await state.client.rank_stats()
    state.client.reset_prefix_cache()
    after = await state.client.rank_stats()
    done = [rank in before and stats.prefix_cache_resets > before[rank].prefix_cache_resets
            for rank, stats in after.items()]
    return {"success": bool(done) and all(done)}


@router.get("/metrics", response_class=Response)
async def metrics(state: ServerState = Depends(get_state)) -> Response:
    try:
        stats = await state.client.rank_stats() if state.client.healthy else {}
    except (EngineDeadError, asyncio.TimeoutError):
        stats = {}
    return Response(state.metrics.render(stats, state.client.rank_states()), media_type=CONTENT_TYPE_LATEST)
