"""Typed request builders: the only place that writes the service's JSON keys and multipart fields.

Each builder takes plain values (a prompt, image bytes read once by the caller, the route's options),
validates the body once against the spec's rules (`models.py`) and returns a `GatewayRequest` that
`GatewayClient.send` puts on the wire as is, on every attempt.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .compat_models import ChatRequest, ImagesRequest, MessagesRequest, ResponsesRequest
from .constants import (
    COMPAT_IMAGE_MODEL,
    DEFAULT_ASPECT_RATIO,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_IMAGES_API_SIZE,
    DEFAULT_MAX_TOKENS,
    MAX_IMAGES_HEADER,
    MAX_IMAGES_MAX,
    MAX_IMAGES_MIN,
    Route,
    model_refusal,
)
from .errors import RequestValidationError
from .models import NativeRequest, describe_validation_error
from .results import ImageUpload


@dataclass(frozen=True)
class GatewayRequest:
    """One validated request, ready to send: its route, model and body (JSON, or multipart for edits)."""

    route: Route
    model: str
    json: dict[str, Any] | None = field(default=None, repr=False)
    form: dict[str, str] | None = None
    """Multipart text fields (the edits route)."""
    files: tuple[tuple[str, ImageUpload], ...] = field(default=(), repr=False)
    """Multipart files as (field name, upload): `image` or `image[]` repeated, then `mask`."""
    max_images: int | None = None
    """`X-Service-Max-Images` (native and chat), None to leave it to the service's default."""

    @property
    def path(self) -> str:
        return self.route.path.format(model=self.model)

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.max_images is None else {MAX_IMAGES_HEADER: str(self.max_images)}


M = TypeVar("M", bound=BaseModel)


def _validated(model_cls: type[M], body: M | Mapping[str, Any], **context: Any) -> M:
    if isinstance(body, model_cls):
        body = body.model_dump(mode="json", exclude_none=True)  # the rules may depend on the context
    try:
        return model_cls.model_validate(body, context=context or None)
    except ValidationError as exc:
        code, message = describe_validation_error(exc)
        raise RequestValidationError(message, code=code) from None


def _dump(body: BaseModel) -> dict[str, Any]:
    return body.model_dump(mode="json", exclude_none=True)


def check_max_images(value: int | None) -> int | None:
    """`X-Service-Max-Images` is an integer from 1 to 4 (or absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not MAX_IMAGES_MIN <= value <= MAX_IMAGES_MAX:
        raise RequestValidationError(
            f"{MAX_IMAGES_HEADER} must be an integer from {MAX_IMAGES_MIN} to {MAX_IMAGES_MAX}, not {value!r}"
        )
    return value


# --- native route ------------------------------------------------------------------------------------


def user_turn(prompt: str, images: Sequence[ImageUpload] = ()) -> dict[str, Any]:
    """A native user turn: the text first, then each reference image as its own part."""
    parts: list[dict[str, Any]] = [{"text": prompt}]
    parts += [
        {"inlineData": {"mimeType": img.mime_type, "data": base64.b64encode(img.data).decode()}}
        for img in images
    ]
    return {"role": "user", "parts": parts}


def native_body(
    model: str, body: NativeRequest | Mapping[str, Any], *, max_images: int | None = None
) -> GatewayRequest:
    """`POST /v1beta/models/{model}:generateContent` with a body given whole."""
    refusal = model_refusal(Route.NATIVE, model)
    if refusal is not None:
        raise RequestValidationError(refusal[1], code=refusal[0])
    request = _validated(NativeRequest, body, model=model)
    return GatewayRequest(Route.NATIVE, model, _dump(request), max_images=check_max_images(max_images))


def native(
    model: str,
    prompt: str,
    *,
    images: Sequence[ImageUpload] = (),
    history: Sequence[Mapping[str, Any]] = (),
    image_size: str = DEFAULT_IMAGE_SIZE,
    aspect_ratio: str = DEFAULT_ASPECT_RATIO,
    max_images: int | None = None,
) -> GatewayRequest:
    """A native generation or edit: `history` holds the earlier turns of an edit chain exactly as sent and
    as returned (model turns unaltered), then the new user turn is `prompt` with `images`."""
    body = {
        "contents": [*history, user_turn(prompt, images)],
        "generationConfig": {
            "responseModalities": ["IMAGE"],
            "candidateCount": 1,
            "imageConfig": {"imageSize": image_size, "aspectRatio": aspect_ratio},
        },
    }
    return native_body(model, body, max_images=max_images)


# --- chat route --------------------------------------------------------------------------------------


def chat_body(body: ChatRequest | Mapping[str, Any], *, max_images: int | None = None) -> GatewayRequest:
    """`POST /v1/chat/completions` with a body given whole."""
    request = _validated(ChatRequest, body)
    return GatewayRequest(Route.CHAT, request.model, _dump(request), max_images=check_max_images(max_images))


def chat(
    model: str,
    prompt: str,
    *,
    image_size: str = DEFAULT_IMAGE_SIZE,
    aspect_ratio: str = DEFAULT_ASPECT_RATIO,
    max_images: int | None = None,
) -> GatewayRequest:
    """An image from the chat route: options under the root key `native`, one choice, no streaming."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "n": 1,
        "stream": False,
        "native": {"image_config": {"image_size": image_size, "aspect_ratio": aspect_ratio}},
    }
    return chat_body(body, max_images=max_images)


# --- images routes -----------------------------------------------------------------------------------


def _images_fields(request: ImagesRequest | Mapping[str, Any]) -> ImagesRequest:
    # The spec gives `model` a default and marks it required: it is always sent explicitly.
    if not isinstance(request, ImagesRequest):
        request = {"model": COMPAT_IMAGE_MODEL, **request}
    return _validated(ImagesRequest, request)


def images_generation_body(request: ImagesRequest | Mapping[str, Any]) -> GatewayRequest:
    """`POST /v1/images/generations` (JSON) with its fields given whole."""
    body = _images_fields(request)
    return GatewayRequest(Route.IMAGES_GENERATIONS, body.model, body.model_dump(mode="json"))


def images_generation(
    prompt: str, *, model: str = COMPAT_IMAGE_MODEL, size: str = DEFAULT_IMAGES_API_SIZE
) -> GatewayRequest:
    return images_generation_body({"model": model, "prompt": prompt, "n": 1, "size": size})


def images_edit_body(
    request: ImagesRequest | Mapping[str, Any],
    images: Sequence[ImageUpload],
    *,
    mask: ImageUpload | None = None,
) -> GatewayRequest:
    """`POST /v1/images/edits` as multipart: `image` for one file, `image[]` repeated for several."""
    body = _images_fields(request)
    if not images:
        raise RequestValidationError("an edit needs at least one reference image")
    name = "image" if len(images) == 1 else "image[]"
    files = [(name, img) for img in images] + ([("mask", mask)] if mask is not None else [])
    form = {k: str(v) for k, v in body.model_dump(mode="json").items()}
    return GatewayRequest(Route.IMAGES_EDITS, body.model, form=form, files=tuple(files))


def images_edit(
    prompt: str,
    images: Sequence[ImageUpload],
    *,
    mask: ImageUpload | None = None,
    model: str = COMPAT_IMAGE_MODEL,
    size: str = DEFAULT_IMAGES_API_SIZE,
) -> GatewayRequest:
    return images_edit_body({"model": model, "prompt": prompt, "n": 1, "size": size}, images, mask=mask)


# --- text relay routes -------------------------------------------------------------------------------


def messages_body(request: MessagesRequest | Mapping[str, Any]) -> GatewayRequest:
    """`POST /v1/messages` with a body given whole (`max_tokens` defaults to the spec's 1024, sent)."""
    if not isinstance(request, MessagesRequest):
        request = {"max_tokens": DEFAULT_MAX_TOKENS, **request}
    body = _validated(MessagesRequest, request)
    return GatewayRequest(Route.MESSAGES, body.model, _dump(body))


def messages(model: str, prompt: str, *, max_tokens: int = DEFAULT_MAX_TOKENS) -> GatewayRequest:
    return messages_body(
        {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": prompt}]}
    )


def responses_body(request: ResponsesRequest | Mapping[str, Any]) -> GatewayRequest:
    """`POST /v1/responses` with a body given whole."""
    body = _validated(ResponsesRequest, request)
    return GatewayRequest(Route.RESPONSES, body.model, _dump(body))


def responses(model: str, prompt: str) -> GatewayRequest:
    return responses_body({"model": model, "input": prompt})
