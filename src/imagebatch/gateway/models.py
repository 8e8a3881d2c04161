"""Pydantic models of every request and response body in the spec, with the spec's rules as validators.

These models are the client's table of the spec's rules: the client builds requests with them and the
manifest checker asks them whether a row would be accepted. The emulator reads requests with its own
(`emulator.bodies`), so that a rule read wrong here is caught by a test rather than passed by both.
A native request's aspect ratio depends on the model in the URL path, so validate a `NativeRequest` with
``context={"model": model}`` (see `validate_native_request`).

This module holds the rules every route shares (explicit nulls, inline images, model and ratio checks)
and the native route's bodies; the OpenAI- and Anthropic-compatible routes' bodies are `compat_models`.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .constants import (
    ASPECT_RATIOS,
    IMAGE_SIZES,
    Route,
    model_refusal,
)
from .imagefile import sniff_mime

# Features the native route refuses by name (spec, Endpoints rule 2); listed so the error says why.
UNSUPPORTED_PART_KEYS = (
    "fileData", "functionCall", "functionResponse", "executableCode", "codeExecutionResult",
)  # fmt: skip


_MODEL_TURN = "_in_model_turn"  # validation-context flag set while a `role: model` content is validated


class StrictBody(BaseModel):
    """A request object of the spec: unknown keys refused, and an optional field is omitted or has a
    value: an explicit `null` is refused (the spec says, e.g., "omit or send integer 1")."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                if value is None and key in cls.model_fields:
                    raise PydanticCustomError(
                        "invalid_request", "{key} is null: omit it or give a value", {"key": key}
                    )
        return data


class OpenBody(BaseModel):
    """A body of the spec that may hold keys beyond its listed ones (passed through, or ignored)."""

    model_config = ConfigDict(extra="allow")


# --- shared rule helpers ---------------------------------------------------------------------------


def check_served(route: Route, model: str) -> str:
    """`model` if `route` serves it, else the service's refusal (`constants.model_refusal`)."""
    refusal = model_refusal(route, model)
    if refusal is not None:
        raise PydanticCustomError(refusal[0], refusal[1])
    return model


def image_size_error(value: str) -> str:
    """The message for an `imageSize` outside `1K`/`2K`/`4K`, with a hint for a lowercase size."""
    hint = f" (did you mean {value.upper()!r}?)" if value.upper() in IMAGE_SIZES else ""
    return f"image size must be one of {', '.join(IMAGE_SIZES)} (case-sensitive), not {value!r}{hint}"


def check_image_size(value: str | None) -> str | None:
    if value is not None and value not in IMAGE_SIZES:
        raise PydanticCustomError("invalid_request", image_size_error(value))
    return value


def check_aspect_ratio(model: str | None, ratio: str | None) -> None:
    """Raise if `ratio` is not supported by native `model` (unknown model: checked elsewhere)."""
    if ratio is None or model not in ASPECT_RATIOS:
        return
    if ratio not in ASPECT_RATIOS[model]:
        raise PydanticCustomError(
            "invalid_request",
            "aspect ratio {ratio} is not supported by {model}; supported: {supported}",
            {"ratio": ratio, "model": model, "supported": ", ".join(ASPECT_RATIOS[model])},
        )


def b64decode_any(value: str) -> bytes:
    """Strict base64 in either alphabet, as the upstream reads proto3 JSON bytes: standard (`+/`) or
    URL-safe (`-_`, what google-genai sends), padded or not; anything else is refused."""
    if "-" in value or "_" in value:
        if "+" in value or "/" in value:
            raise binascii.Error("mixes the standard and URL-safe base64 alphabets")
        value = value.replace("-", "+").replace("_", "/")
    if len(value) % 4 and "=" not in value:
        value += "=" * (-len(value) % 4)
    return binascii.a2b_base64(value, strict_mode=True)


def standard_base64(value: str) -> str:
    """`value` (either alphabet, padded or not) in the standard, padded form; unchanged if not base64."""
    try:
        return base64.b64encode(b64decode_any(value)).decode()
    except (binascii.Error, ValueError):
        return value


def decode_base64(value: str) -> bytes:
    """Strict base64 decode of inline image data (no data-URL prefix, no stray characters)."""
    if value.startswith("data:"):
        raise PydanticCustomError(
            "invalid_request", "inlineData.data must be plain base64 without a data-URL prefix"
        )
    try:
        return b64decode_any(value)
    except (binascii.Error, ValueError):
        raise PydanticCustomError("invalid_request", "inlineData.data is not valid base64") from None


def reject_non_integer_one(value: Any) -> Any:
    """`n` is the JSON integer 1: refuse `true` and `1.0`, which `Literal[1]` alone accepts (1 == True)."""
    if isinstance(value, bool | float):
        raise PydanticCustomError("invalid_request", "n must be the integer 1")
    return value


# --- native request --------------------------------------------------------------------------------


class InlineData(StrictBody):
    """An image carried inside a request or response part."""

    mimeType: Literal["image/png", "image/jpeg"]
    """The file type; must agree with the decoded bytes. `mime_type` (what google-genai sends: proto3
    JSON accepts both spellings) is read as the same field; both given and different is refused."""
    data: str
    """Base64 of the original file bytes (either alphabet, padding optional), without a data-URL prefix."""

    @model_validator(mode="before")
    @classmethod
    def _snake_case_alias(cls, value: Any) -> Any:
        if not isinstance(value, dict) or "mime_type" not in value:
            return value
        value = dict(value)
        snake = value.pop("mime_type")
        if "mimeType" in value and value["mimeType"] != snake:
            raise PydanticCustomError(
                "invalid_request",
                "inlineData has both mimeType ({camel}) and mime_type ({snake}); send one",
                {"camel": value["mimeType"], "snake": snake},
            )
        value["mimeType"] = snake
        return value

    @model_validator(mode="after")
    def _bytes_match_type(self, info: ValidationInfo) -> InlineData:
        raw = decode_base64(self.data)
        actual = sniff_mime(raw)
        # A model turn is the service's own answer, sent back unaltered as the spec demands: its label is
        # not ours to correct, so there only the bytes must be an image.
        in_model_turn = bool((info.context or {}).get(_MODEL_TURN))
        if actual != self.mimeType and not (in_model_turn and actual is not None):
            raise PydanticCustomError(
                "invalid_request",
                "inlineData.data is {actual}, but mimeType says {declared}",
                {"actual": actual or "not a PNG or JPEG image", "declared": self.mimeType},
            )
        return self

    def decoded(self) -> bytes:
        return b64decode_any(self.data)


class Part(OpenBody):
    """One item of a content's parts: text or an image, never both. Extra properties are allowed."""

    text: str | None = None
    """A description or edit instruction (or, in a model turn, the model's text)."""
    inlineData: InlineData | None = None
    """An image."""
    thought: bool | None = None
    """Marks an intermediate part in a model turn; never a result."""
    thoughtSignature: str | None = None
    """Opaque signature the service puts on model parts; must be sent back unaltered."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in UNSUPPORTED_PART_KEYS:
                if key in data:
                    raise PydanticCustomError(
                        "invalid_request", "part field {key} is not supported by this service", {"key": key}
                    )
        return data

    @model_validator(mode="after")
    def _text_or_image(self, info: ValidationInfo) -> Part:
        # A model turn's parts are the service's own ("each may carry" text, thought, signature, image),
        # sent back unaltered: there a part may carry neither, never both.
        in_model_turn = bool((info.context or {}).get(_MODEL_TURN))
        if self.text is not None and self.inlineData is not None:
            message = "each part must carry exactly one of text or inlineData"
            raise PydanticCustomError("invalid_request", message)
        if self.text is None and self.inlineData is None and not in_model_turn:
            raise PydanticCustomError(
                "invalid_request", "each part must carry exactly one of text or inlineData"
            )
        return self


class Content(StrictBody):
    """One turn of the conversation."""

    role: Literal["user", "model"] = "user"
    """`user` for a new request, `model` for an earlier model reply in an edit history."""
    parts: list[Part] = Field(min_length=1)
    """Text and images as separate items; at least one."""

    @model_validator(mode="wrap")
    @classmethod
    def _mark_model_turn(cls, data: Any, handler: Any, info: ValidationInfo) -> Any:
        context = info.context
        if isinstance(data, dict) and data.get("role") == "model" and isinstance(context, dict):
            context[_MODEL_TURN] = True
            try:
                return handler(data)
            finally:
                context.pop(_MODEL_TURN, None)
        return handler(data)


class ImageConfig(StrictBody):
    imageSize: str | None = None
    """`1K`, `2K` or `4K` (case-sensitive); default `1K`."""
    aspectRatio: str | None = None
    """One of the model's ratios; default `1:1`."""

    _check_size = field_validator("imageSize")(classmethod(lambda cls, v: check_image_size(v)))

    @model_validator(mode="after")
    def _ratio_for_model(self, info: ValidationInfo) -> ImageConfig:
        model = (info.context or {}).get("model")
        check_aspect_ratio(model, self.aspectRatio)
        return self


class GenerationConfig(StrictBody):
    responseModalities: list[Literal["IMAGE"]] | None = Field(default=None, min_length=1, max_length=1)
    """Only `["IMAGE"]`."""
    candidateCount: StrictInt | None = None
    """Only the integer 1."""
    imageConfig: ImageConfig | None = None

    @field_validator("candidateCount")
    @classmethod
    def _one_candidate(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise PydanticCustomError("invalid_request", "candidateCount must be 1")
        return v


class NativeRequest(StrictBody):
    """Body of `POST /v1beta/models/{model}:generateContent`."""

    contents: list[Content] = Field(min_length=1)
    generationConfig: GenerationConfig | None = None


def validate_native_request(body: Any, model: str) -> NativeRequest:
    """Validate a native body for `model` (the ratio rule depends on it)."""
    return NativeRequest.model_validate(body, context={"model": model})


# --- native response -------------------------------------------------------------------------------


class ResponseInlineData(OpenBody):
    mimeType: str
    data: str


class ResponsePart(OpenBody):
    text: str | None = None
    thought: bool | None = None
    thoughtSignature: str | None = None
    inlineData: ResponseInlineData | None = None


class ResponseContent(OpenBody):
    role: str = "model"
    parts: list[ResponsePart] = Field(default_factory=list)


class Candidate(OpenBody):
    content: ResponseContent | None = None
    finishReason: str | None = None


class NativeResponse(OpenBody):
    """A 200 answer of the native route."""

    candidates: list[Candidate] = Field(default_factory=list)
    promptFeedback: dict[str, Any] | None = None
    usageMetadata: dict[str, Any] | None = None


def describe_validation_error(exc: ValidationError) -> tuple[str, str]:
    """Turn a pydantic error into (code, message) naming the first offending field by its JSON path."""
    first = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-"))
    code = (
        first["type"] if first["type"] in ("unsupported_endpoint", "model_not_found") else "invalid_request"
    )
    if first["type"] == "extra_forbidden":
        msg = f"unknown field {loc!r}"
    elif first["type"] == "missing":
        msg = f"missing required field {loc!r}"
    else:
        msg = f"{loc}: {first['msg']}" if loc else first["msg"]
    return code, msg


__all__ = [
    "UNSUPPORTED_PART_KEYS",
    "Candidate",
    "Content",
    "GenerationConfig",
    "ImageConfig",
    "InlineData",
    "NativeRequest",
    "NativeResponse",
    "Part",
    "check_aspect_ratio",
    "check_image_size",
    "describe_validation_error",
    "validate_native_request",
]
