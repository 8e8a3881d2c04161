"""Readers of the service's success answers: final images (by their bytes), text, usage, request ids.

Each reader takes a parsed JSON body and returns a result of `results.py`; a body that is not what the spec
describes raises `ResponseFormatError`.
"""

from __future__ import annotations

import binascii
import re
from typing import Any

import httpx
from pydantic import ValidationError

from .compat_models import ChatResponse, ImagesResponse
from .constants import Route
from .errors import ResponseFormatError
from .imagefile import NotAnImageError, inspect_image
from .models import NativeResponse, describe_validation_error
from .results import GeneratedImage, GenerationResult, ImageResult, NoImageResult, TextResult

REQUEST_ID_HEADERS = ("x-request-id", "request-id", "x-service-request-id")
_DATA_URL = re.compile(r"data:(image/(?:png|jpeg));base64,([A-Za-z0-9+/=]+)")
_MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*data:image/(?:png|jpeg);base64,[A-Za-z0-9+/=]+\s*\)")


def _decode_image(data_b64: str, where: str) -> GeneratedImage:
    try:
        # As strict as base64.b64decode(validate=True), and several times faster on megabytes.
        raw = binascii.a2b_base64(data_b64, strict_mode=True)
    except (binascii.Error, ValueError):
        raise ResponseFormatError(f"{where}: image data is not valid base64") from None
    try:
        info = inspect_image(raw)
    except NotAnImageError as exc:
        raise ResponseFormatError(f"{where}: {exc}") from None
    # The declared mimeType may disagree with the bytes; the bytes decide (a .png holding JPEG is a lie).
    return GeneratedImage(raw, info.mime_type, info.width, info.height)


def read_native_response(body: Any) -> tuple[list[GeneratedImage], NativeResponse]:
    """Final images of a native answer: thought parts skipped, every image part kept, in order."""
    try:
        parsed = NativeResponse.model_validate(body)
    except ValidationError as exc:
        raise ResponseFormatError(f"native response: {describe_validation_error(exc)[1]}") from None
    images: list[GeneratedImage] = []
    for ci, cand in enumerate(parsed.candidates):
        parts = cand.content.parts if cand.content else []
        for pi, part in enumerate(parts):
            if part.thought or part.inlineData is None:
                continue
            images.append(_decode_image(part.inlineData.data, f"candidates[{ci}].content.parts[{pi}]"))
    return images, parsed


def _native_text(parsed: NativeResponse) -> str | None:
    texts = [
        p.text
        for c in parsed.candidates
        for p in (c.content.parts if c.content else [])
        if p.text is not None and not p.thought
    ]
    return "\n".join(texts) if texts else None


def read_chat_response(body: Any) -> tuple[list[GeneratedImage], str | None, ChatResponse]:
    """Images from the Markdown data URLs in `choices[0].message.content`, and the text around them."""
    try:
        parsed = ChatResponse.model_validate(body)
    except ValidationError as exc:
        raise ResponseFormatError(f"chat response: {describe_validation_error(exc)[1]}") from None
    content = parsed.choices[0].message.content or ""
    images = [
        _decode_image(m.group(2), f"choices[0].message.content data URL {i}")
        for i, m in enumerate(_DATA_URL.finditer(content))
    ]
    without_markdown = _MARKDOWN_IMAGE.sub("", content)
    text = _DATA_URL.sub("", without_markdown).strip() or None
    return images, text, parsed


def read_images_response(body: Any) -> tuple[list[GeneratedImage], ImagesResponse]:
    """The image in `data[0].b64_json` (extra item fields such as `revised_prompt` tolerated)."""
    try:
        parsed = ImagesResponse.model_validate(body)
    except ValidationError as exc:
        raise ResponseFormatError(f"images response: {describe_validation_error(exc)[1]}") from None
    images = [_decode_image(d.b64_json, f"data[{i}].b64_json") for i, d in enumerate(parsed.data)]
    return images, parsed


def read_text(route: Route, body: Any) -> str:
    """The text of a messages or responses answer (their full shape is not in the spec; we read the usual)."""
    if not isinstance(body, dict):
        raise ResponseFormatError(f"{route} response is not a JSON object")
    if route is Route.MESSAGES:
        blocks = body.get("content")
        if isinstance(blocks, list):
            return "".join(
                b["text"]
                for b in blocks
                if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
            )
        return blocks if isinstance(blocks, str) else ""
    if isinstance(body.get("output_text"), str):
        return body["output_text"]
    output = body.get("output")
    if output is not None and not isinstance(output, list):
        raise ResponseFormatError(f"{route} response: output is not a list")
    texts: list[str] = []
    for item in output or []:
        for block in (item.get("content") or []) if isinstance(item, dict) else []:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                texts.append(block["text"])
    return "".join(texts)


def request_id_of(response: httpx.Response) -> str | None:
    for name in REQUEST_ID_HEADERS:
        if name in response.headers:
            return response.headers[name]
    return None


Result = ImageResult | NoImageResult | TextResult


def read_result(route: Route, body: Any, request_id: str | None, attempts: int) -> Result:
    """The result of a success answer on `route`."""
    if route is Route.NATIVE:
        return native_result(body, request_id, attempts)
    if route is Route.CHAT:
        return chat_result(body, request_id, attempts)
    if route in (Route.IMAGES_GENERATIONS, Route.IMAGES_EDITS):
        return images_result(body, request_id, attempts)
    return text_result(route, body, request_id, attempts)


def native_result(body: Any, request_id: str | None, attempts: int) -> GenerationResult:
    """A native answer: its final images, or what it said instead (text, finishReason, feedback)."""
    images, parsed = read_native_response(body)
    first = parsed.candidates[0] if parsed.candidates else None
    content = body["candidates"][0].get("content") if first and first.content else None
    common: dict[str, Any] = {
        "text": _native_text(parsed),
        "finish_reason": first.finishReason if first else None,
        "prompt_feedback": parsed.promptFeedback,
        "usage": parsed.usageMetadata,
        "request_id": request_id,
        "attempts": attempts,
        "model_content": content,
    }
    return ImageResult(images, **common) if images else NoImageResult(**common)


def chat_result(body: Any, request_id: str | None, attempts: int) -> GenerationResult:
    images, text, parsed = read_chat_response(body)
    common: dict[str, Any] = {
        "text": text,
        "finish_reason": parsed.choices[0].finish_reason,
        "usage": parsed.usage,
        "request_id": request_id,
        "attempts": attempts,
    }
    return ImageResult(images, **common) if images else NoImageResult(**common)


def images_result(body: Any, request_id: str | None, attempts: int) -> GenerationResult:
    images, parsed = read_images_response(body)
    revised = getattr(parsed.data[0], "revised_prompt", None)
    return ImageResult(
        images,
        text=revised if isinstance(revised, str) else None,
        usage=_usage(body),
        request_id=request_id,
        attempts=attempts,
    )


def text_result(route: Route, body: Any, request_id: str | None, attempts: int) -> TextResult:
    text = read_text(route, body)
    return TextResult(text=text, raw=body, usage=_usage(body), request_id=request_id, attempts=attempts)


def _usage(body: Any) -> dict[str, Any] | None:
    usage = body.get("usage") if isinstance(body, dict) else None
    return usage if isinstance(usage, dict) else None
