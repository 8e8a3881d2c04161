"""The text relay routes: `POST /v1/messages` (messages-compatible) and `POST /v1/responses`
(responses-compatible). The reply is a deterministic echo; the point is the wire, auth and billing."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from imagebatch.gateway.constants import Route

from .bodies import MessagesRequest, ResponsesRequest
from .deps import EmulatorDep, JsonBodyDep, RecordDep, bearer_auth, mark_route, messages_auth
from .errors import ServiceError
from .generation import begin, finish, no_query, text_tokens, validate

router = APIRouter(tags=["text relay"])


def _no_stream(body: dict[str, Any]) -> None:
    if body.get("stream") not in (None, False):
        raise ServiceError(400, "streaming is not supported: omit 'stream' or send false")


def _reply(model: str, prompt: str) -> str:
    snippet = " ".join(prompt.split())[:200]
    return f"[{model} via the imagebatch emulator] You said: {snippet}"


def _message_text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(str(block.get("text", "")) for block in content if block.get("type") == "text")


@router.post(
    "/v1/messages",
    dependencies=[Depends(mark_route(Route.MESSAGES)), Depends(messages_auth), Depends(no_query)],
)
async def messages(
    request: Request,
    emu: EmulatorDep,
    record: RecordDep,
    body: JsonBodyDep,
) -> Response:
    params = validate(MessagesRequest, body)
    _no_stream(body)
    users = [_message_text(m.content) for m in params.messages if m.role == "user"]
    if not users:
        raise ServiceError(400, "messages must contain at least one user message")
    prompt = users[-1]
    attempt = await begin(
        emu, record, route=Route.MESSAGES, model=params.model, prompt=prompt, fingerprint=await request.body()
    )
    reply = _reply(params.model, prompt)
    stop_reason = "end_turn"
    if text_tokens(reply) > params.max_tokens:
        # Honour max_tokens the way the real API does: cut the text and say why it stopped.
        reply, stop_reason = reply[: params.max_tokens * 4], "max_tokens"
    input_tokens = sum(text_tokens(_message_text(m.content)) for m in params.messages)
    usage = {"input_tokens": input_tokens, "output_tokens": text_tokens(reply)}
    answer = {
        "id": "msg_" + record.request_id.removeprefix("req_"),
        "type": "message",
        "role": "assistant",
        "model": params.model,
        "content": [{"type": "text", "text": reply}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }
    return await finish(emu, record, attempt, JSONResponse(answer), images=0, usage=usage)


@router.post(
    "/v1/responses",
    dependencies=[Depends(mark_route(Route.RESPONSES)), Depends(bearer_auth), Depends(no_query)],
)
async def responses(
    request: Request,
    emu: EmulatorDep,
    record: RecordDep,
    body: JsonBodyDep,
) -> Response:
    params = validate(ResponsesRequest, body)
    _no_stream(body)
    attempt = await begin(
        emu, record, route=Route.RESPONSES, model=params.model, prompt=params.input,
        fingerprint=await request.body(),
    )  # fmt: skip
    reply = _reply(params.model, params.input)
    usage = {
        "input_tokens": text_tokens(params.input),
        "output_tokens": text_tokens(reply),
        "total_tokens": text_tokens(params.input) + text_tokens(reply),
    }
    response_id = record.request_id.removeprefix("req_")
    answer = {
        "id": "resp_" + response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": params.model,
        "output": [
            {
                "type": "message",
                "id": "msg_" + response_id,
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply, "annotations": []}],
            }
        ],
        "output_text": reply,
        "usage": usage,
    }
    return await finish(emu, record, attempt, JSONResponse(answer), images=0, usage=usage)
