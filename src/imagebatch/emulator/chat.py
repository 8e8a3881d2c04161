"""The chat route, `POST /v1/chat/completions`: images come back as Markdown data URLs in the text."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from imagebatch.gateway.constants import Route

from .bodies import ChatRequest
from .deps import EmulatorDep, JsonBodyDep, MaxImagesDep, RecordDep, bearer_auth, mark_route
from .errors import ServiceError
from .generation import (
    Attempt,
    b64,
    begin,
    delivered_count,
    finish,
    image_format,
    no_query,
    render,
    text_tokens,
    validate,
)
from .native import output_image_tokens
from .render import RenderSpec, native_pixel_size
from .spec import DEFAULT_ASPECT_RATIO, DEFAULT_IMAGE_SIZE
from .state import EmulatorState

router = APIRouter(tags=["chat"])


@router.post(
    "/v1/chat/completions",
    dependencies=[Depends(mark_route(Route.CHAT)), Depends(bearer_auth), Depends(no_query)],
)
async def chat_completions(
    request: Request,
    emu: EmulatorDep,
    record: RecordDep,
    cap: MaxImagesDep,
    body: JsonBodyDep,
) -> Response:
    chat = validate(ChatRequest, body)
    user_turns = [m.content for m in chat.messages if m.role == "user"]
    if not user_turns:
        raise ServiceError(400, "messages must contain at least one user message")
    prompt = user_turns[-1]
    config = chat.native.image_config if chat.native else None
    image_size = (config and config.image_size) or DEFAULT_IMAGE_SIZE
    ratio = (config and config.aspect_ratio) or DEFAULT_ASPECT_RATIO

    attempt = await begin(
        emu, record, route=Route.CHAT, model=chat.model, prompt=prompt, fingerprint=await request.body()
    )
    if attempt.fault == "no_image":
        count, finish_reason = 0, "content_filter"
        content = "I can't create that image: the request was blocked by the safety filter."
    else:
        count, finish_reason = delivered_count(emu, attempt, cap), "stop"
        size = native_pixel_size(image_size, ratio)
        content = await _images_in_text(emu, attempt, count, size, prompt, chat.model)
    prompt_tokens = sum(text_tokens(m.content) for m in chat.messages)
    completion = output_image_tokens(image_size) * count + text_tokens(content.split("![", 1)[0])
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }
    answer = {
        "id": "chatcmpl-" + record.request_id.removeprefix("req_"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
    }
    return await finish(emu, record, attempt, JSONResponse(answer), images=count, usage=usage)


async def _images_in_text(
    emu: EmulatorState, attempt: Attempt, count: int, size: tuple[int, int], prompt: str, model: str
) -> str:
    """The assistant's text: a line, then each image as a markdown data URL."""
    links = []
    for i in range(count):
        spec = RenderSpec(
            *size, prompt, emu.settings.seed, variant=i, label=model, fmt=image_format(emu, attempt, i)
        )
        mime, data = await render(emu, spec)
        links.append(f"![image](data:{mime};base64,{b64(data)})")
    lead = "Here is the image you asked for." if count == 1 else f"Here are {count} images."
    return "\n\n".join([lead, *links])
