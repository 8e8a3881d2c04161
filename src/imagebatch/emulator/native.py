"""The native route, `POST /v1beta/models/{model}:generateContent`: text-to-image, reference-image edits
and multi-turn edits with signed model turns."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.responses import Response

from imagebatch.gateway.constants import Route
from imagebatch.gateway.imagefile import NotAnImageError, inspect_image

from .bodies import NativeRequest, native_request
from .deps import EmulatorDep, JsonBodyDep, MaxImagesDep, RecordDep, native_auth
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
    validation_failure,
)
from .render import THOUGHT_LONG_SIDE, RenderSpec, native_pixel_size
from .signing import history_digests
from .spec import DEFAULT_ASPECT_RATIO, DEFAULT_IMAGE_SIZE, refusal
from .state import EmulatorState

router = APIRouter(tags=["native"])

ACTION = "generateContent"
INPUT_IMAGE_TOKENS = 258
THOUGHT_TOKENS = 120
SAFETY_CATEGORIES = (
    "HARM_CATEGORY_HATE_SPEECH", "HARM_CATEGORY_DANGEROUS_CONTENT",
    "HARM_CATEGORY_HARASSMENT", "HARM_CATEGORY_SEXUALLY_EXPLICIT",
)  # fmt: skip


def output_image_tokens(image_size: str) -> int:
    return 2000 if image_size == "4K" else 1120


def native_model(model_action: str, record: RecordDep) -> str:
    """The model of the path `{model}:generateContent`; 404 for another method or a model outside the set.

    The segment is taken whole and split here (model IDs contain no colon) so that every wrong method or
    model gets a 404 that says what is wrong, in the spec's error body.
    """
    model, sep, action = model_action.rpartition(":")
    if not sep:
        raise ServiceError(404, f"no route /v1beta/models/{model_action}; use {{model}}:{ACTION}")
    if action != ACTION:
        raise ServiceError(404, f"method {action!r} is not served (streaming is not supported); use {ACTION}")
    refused = refusal(Route.NATIVE, model)
    if refused is not None:
        raise ServiceError(404, refused[2], refused[1])  # in the path: a wrong URL, whatever the model
    record.route, record.model = Route.NATIVE.value, model
    return model


def _check_history(
    emu: EmulatorState, body: dict[str, Any], request: NativeRequest, digests: list[bytes]
) -> None:
    """Model turns must come back signed, unaltered and where they were answered; user turns carry no
    signatures and only decodable images.

    `digests` are `history_digests(body["contents"], model)`: a model turn at `contents[i]` is verified
    against the conversation actually sent before it.
    """
    if request.contents[-1].role != "user":
        raise ServiceError(400, "the last item of contents must be the new user turn (role user)")
    for i, content in enumerate(request.contents):
        if content.role != "model":
            continue
        if i == 0:
            raise ServiceError(
                400,
                "contents[0] is a model turn with no user turn before it: send the full history, "
                "starting with the first user turn",
            )
        if request.contents[i - 1].role == "model":
            raise ServiceError(
                400,
                f"contents[{i}] is a model turn right after another model turn (contents[{i - 1}]): "
                "each model turn follows the user turn it answered",
            )
    for i, content in enumerate(request.contents):
        raw_parts: list[dict[str, Any]] = body["contents"][i]["parts"]
        if content.role == "model":
            problem = emu.signer.verify(raw_parts, f"contents[{i}]", digests[i])
            if problem:
                raise ServiceError(400, problem)
            continue
        for j, part in enumerate(content.parts):
            if part.thoughtSignature is not None:
                raise ServiceError(
                    400,
                    f"contents[{i}].parts[{j}] is a user part with a thoughtSignature; the service "
                    "issues signatures only on model turns",
                )
            if part.inlineData is not None:
                try:
                    inspect_image(part.inlineData.decoded())
                except NotAnImageError as exc:
                    raise ServiceError(400, f"contents[{i}].parts[{j}].inlineData: {exc}") from None


def _references(request: NativeRequest) -> tuple[bytes, ...]:
    """The images to edit: those of the new user turn, else the latest final image of a model turn."""
    latest = request.contents[-1]
    own = tuple(p.inlineData.decoded() for p in latest.parts if p.inlineData is not None)
    if own:
        return own
    for content in reversed(request.contents[:-1]):
        if content.role == "model":
            finals = [p.inlineData.decoded() for p in content.parts if p.inlineData and not p.thought]
            if finals:
                return (finals[-1],)
    return ()


def _usage(
    request: NativeRequest, image_size: str, images: int, thought_image: bool, text: str
) -> dict[str, Any]:
    prompt_text = sum(text_tokens(p.text) for c in request.contents for p in c.parts if p.text is not None)
    prompt_images = INPUT_IMAGE_TOKENS * sum(1 for c in request.contents for p in c.parts if p.inlineData)
    image_tokens = output_image_tokens(image_size) * images
    thoughts = THOUGHT_TOKENS + (INPUT_IMAGE_TOKENS if thought_image else 0)
    candidates = image_tokens + text_tokens(text)
    return {
        "promptTokenCount": prompt_text + prompt_images,
        "candidatesTokenCount": candidates,
        "thoughtsTokenCount": thoughts,
        "totalTokenCount": prompt_text + prompt_images + candidates + thoughts,
        "promptTokensDetails": [
            {"modality": "TEXT", "tokenCount": prompt_text},
            {"modality": "IMAGE", "tokenCount": prompt_images},
        ],
        "candidatesTokensDetails": [{"modality": "IMAGE", "tokenCount": image_tokens}],
    }


async def _parts(
    emu: EmulatorState,
    attempt: Attempt,
    *,
    cap: int,
    image_size: str,
    ratio: str,
    references: tuple[bytes, ...],
) -> tuple[list[dict[str, Any]], int, bool, str]:
    """The parts of the answer (unsigned), the number of final images, whether a thought image is in."""
    seed = emu.settings.seed
    prompt = attempt.prompt
    width, height = native_pixel_size(image_size, ratio)
    parts: list[dict[str, Any]] = [
        {
            "text": f"**Composing the image**\n\nA {width}x{height} ({ratio}) picture of: {prompt[:200]}",
            "thought": True,
        }
    ]
    thought_image = attempt.chance(seed, "thought-image") < emu.settings.thought_image_rate
    if thought_image:
        tw, th = native_pixel_size(image_size, ratio, long_side=THOUGHT_LONG_SIDE)
        draft = RenderSpec(tw, th, prompt, seed, label="draft", references=references[:1], draft=True)
        mime, data = await render(emu, draft)
        parts.append({"inlineData": {"mimeType": mime, "data": b64(data)}, "thought": True})
    if attempt.fault == "no_image":
        text = "I can't create that image: the request was blocked by the safety filter."
        parts.append({"text": text})
        return parts, 0, thought_image, text

    count = delivered_count(emu, attempt, cap)
    images = []
    for i in range(count):
        spec = RenderSpec(
            width, height, prompt, seed, variant=i, label=attempt.model, references=references,
            fmt=image_format(emu, attempt, i),
        )  # fmt: skip
        mime, data = await render(emu, spec)
        images.append({"inlineData": {"mimeType": mime, "data": b64(data)}})
    text = "Here is the image you asked for." if count == 1 else f"Here are {count} images."
    # The final image is not necessarily the first part: the text sometimes leads, sometimes follows.
    if attempt.chance(seed, "text-first") < 0.5:
        parts += [{"text": text}, *images]
    else:
        parts += [*images, {"text": text}]
    return parts, count, thought_image, text


@router.post("/v1beta/models/{model_action}")
async def generate_content(
    request: Request,
    emu: EmulatorDep,
    record: RecordDep,
    model: Annotated[str, Depends(native_model)],
    _auth: Annotated[None, Depends(native_auth)],
    cap: MaxImagesDep,
    _query: Annotated[None, Depends(no_query)],  # after auth: a key in the query alone is a 401
    body: JsonBodyDep,
) -> Response:
    try:
        native = native_request(body, model)
    except ValidationError as exc:
        raise validation_failure(exc) from None
    digests = history_digests(body["contents"], model)
    _check_history(emu, body, native, digests)
    latest = native.contents[-1]
    prompt = "\n".join(p.text for p in latest.parts if p.text is not None)
    image_config = native.generationConfig.imageConfig if native.generationConfig else None
    image_size = (image_config and image_config.imageSize) or DEFAULT_IMAGE_SIZE
    ratio = (image_config and image_config.aspectRatio) or DEFAULT_ASPECT_RATIO

    attempt = await begin(
        emu, record, route=Route.NATIVE, model=model, prompt=prompt, fingerprint=await request.body()
    )
    parts, count, thought_image, text = await _parts(
        emu, attempt, cap=cap, image_size=image_size, ratio=ratio, references=_references(native)
    )
    usage = _usage(native, image_size, count, thought_image, text)
    blocked = attempt.fault == "no_image"
    content = {"role": "model", "parts": emu.signer.sign(parts, digests[-1])}
    if emu.settings.log_contents:
        record.contents, record.answer = body["contents"], content
    answer = {
        "candidates": [
            {
                "content": content,
                "finishReason": "SAFETY" if blocked else "STOP",
                "index": 0,
                "safetyRatings": [
                    {"category": c, "probability": "HIGH" if blocked and k == 0 else "NEGLIGIBLE"}
                    for k, c in enumerate(SAFETY_CATEGORIES)
                ],
            }
        ],
        "promptFeedback": {
            "safetyRatings": [{"category": c, "probability": "NEGLIGIBLE"} for c in SAFETY_CATEGORIES]
        },
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": record.request_id.removeprefix("req_"),
    }
    return await finish(emu, record, attempt, JSONResponse(answer), images=count, usage=usage)
