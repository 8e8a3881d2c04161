"""The request bodies the emulator accepts, as Pydantic models of its own reading of the spec, each rule a
validator that raises the spec's error code (`invalid_request`, `unsupported_endpoint`, `model_not_found`).

These are not the client's `gateway.models`: the emulator is the second reading the client is tested
against, so it keeps its own (see `spec`). `refused(exc)` turns a validation error into (status, code,
message) naming the first offending field by its JSON path.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, ValidationInfo
from pydantic import field_validator as field_rule
from pydantic import model_validator as body_rule
from pydantic_core import PydanticCustomError

from imagebatch.gateway.constants import Route
from imagebatch.gateway.imagefile import sniff_mime

from .spec import (
    ASPECT_RATIOS,
    COMPAT_IMAGE_MODEL,
    DEFAULT_IMAGES_SIZE,
    DEFAULT_MAX_TOKENS,
    IMAGE_SIZES,
    IMAGES_SIZES,
    INPUT_MIME_TYPES,
    refusal,
)

# Native features the spec lists as unsupported (Endpoints, rule 2) that would arrive as part keys.
UNSUPPORTED_PART_KEYS = (
    "fileData", "functionCall", "functionResponse", "executableCode", "codeExecutionResult",
)  # fmt: skip
# Chat keys that mean image options nested the wrong way (the spec nests them under `native.image_config`).
CHAT_MISNESTED_KEYS = ("image_config", "imageConfig", "extra_body", "generationConfig")
# Chat keys of features the spec lists as unsupported: ignoring them would answer something else.
CHAT_UNSUPPORTED_KEYS = (
    "tools", "functions", "tool_choice", "function_call", "web_search_options", "response_format",
    "modalities", "stream_options", "audio",
)  # fmt: skip
IN_MODEL_TURN = "in_model_turn"  # validation-context flag while a `role: model` content is validated


def bad(message: str, code: str = "invalid_request") -> PydanticCustomError:
    return PydanticCustomError(code, message)  # no context given: the message is taken as it is


def served(route: Route, model: str) -> str:
    said = refusal(route, model)
    if said is not None:
        raise bad(said[2], said[1])
    return model


def check_size(size: str | None) -> str | None:
    if size is not None and size not in IMAGE_SIZES:
        hint = f" (did you mean {size.upper()!r}?)" if size.upper() in IMAGE_SIZES else ""
        raise bad(f"image size must be one of 1K, 2K, 4K (case-sensitive), not {size!r}{hint}")
    return size


def check_ratio(model: str | None, ratio: str | None) -> None:
    if ratio is not None and model in ASPECT_RATIOS and ratio not in ASPECT_RATIOS[model]:
        raise bad(f"aspect ratio {ratio} is not supported by {model}")


def only_integer_one(value: Any, name: str) -> Any:
    """`true` and `1.0` equal 1 in Python; the spec's value is the JSON integer 1."""
    if value is not None and (isinstance(value, bool | float) or value != 1):
        raise bad(f"{name} must be the integer 1")
    return value


def b64decode_any(value: str) -> bytes:
    """Strict base64 in either alphabet, padded or not, as proto3 JSON reads bytes (google-genai sends the
    URL-safe one); a mix of the two alphabets, or any stray character, is refused."""
    if "-" in value or "_" in value:
        if "+" in value or "/" in value:
            raise binascii.Error("mixes the standard and URL-safe base64 alphabets")
        value = value.replace("-", "+").replace("_", "/")
    if len(value) % 4 and "=" not in value:
        value += "=" * (-len(value) % 4)
    return binascii.a2b_base64(value, strict_mode=True)


def standard_base64(value: str) -> str:
    """`value` in the standard, padded alphabet; unchanged if it is not base64."""
    try:
        return base64.b64encode(b64decode_any(value)).decode()
    except (binascii.Error, ValueError):
        return value


class Strict(BaseModel):
    """A body of the spec with a closed set of keys; an optional key is omitted or has a value (`null` is
    refused: the spec says "omit or send")."""

    model_config = ConfigDict(extra="forbid")

    @body_rule(mode="before")
    @classmethod
    def _no_null(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                if value is None and key in cls.model_fields:
                    raise bad(f"{key} is null: omit it or give a value")
        return data


class Open(BaseModel):
    """A body whose keys beyond the listed ones the spec does not show: they are let through."""

    model_config = ConfigDict(extra="allow")


# --- native route ----------------------------------------------------------------------------------


class InlineData(Strict):
    mimeType: str
    data: str

    @body_rule(mode="before")
    @classmethod
    def _either_spelling(cls, value: Any) -> Any:
        # proto3 JSON accepts `mime_type` too (google-genai sends it); two different values are refused.
        if isinstance(value, dict) and "mime_type" in value:
            value = dict(value)
            snake = value.pop("mime_type")
            if value.setdefault("mimeType", snake) != snake:
                raise bad(
                    f"inlineData has both mimeType ({value['mimeType']}) and mime_type ({snake}); send one"
                )
        return value

    @body_rule(mode="after")
    def _an_image_of_its_type(self, info: ValidationInfo) -> InlineData:
        if self.mimeType not in INPUT_MIME_TYPES:
            raise bad(f"inlineData.mimeType must be image/png or image/jpeg, not {self.mimeType!r}")
        if self.data.startswith("data:"):
            raise bad("inlineData.data must be plain base64 without a data-URL prefix")
        try:
            actual = sniff_mime(b64decode_any(self.data))
        except (binascii.Error, ValueError):
            raise bad("inlineData.data is not valid base64") from None
        # A model turn is the service's own answer sent back unaltered: its label is not the caller's to
        # correct, so there the bytes need only be an image.
        if actual is None or (actual != self.mimeType and not (info.context or {}).get(IN_MODEL_TURN)):
            raise bad(
                f"inlineData.data is {actual or 'not a PNG or JPEG image'}, but mimeType says {self.mimeType}"
            )
        return self

    def decoded(self) -> bytes:
        return b64decode_any(self.data)


class Part(Open):
    text: str | None = None
    inlineData: InlineData | None = None
    thought: bool | None = None
    thoughtSignature: str | None = None

    @body_rule(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        for key in UNSUPPORTED_PART_KEYS:
            if isinstance(data, dict) and key in data:
                raise bad(f"part field {key} is not supported by this service")
        return data

    @body_rule(mode="after")
    def _text_or_image(self, info: ValidationInfo) -> Part:
        # A model turn's part may carry neither (a signature alone); a user's carries exactly one.
        has = (self.text is not None) + (self.inlineData is not None)
        if has == 2 or (has == 0 and not (info.context or {}).get(IN_MODEL_TURN)):
            raise bad("each part must carry exactly one of text or inlineData")
        return self


class Content(Strict):
    role: Literal["user", "model"] = "user"
    parts: list[Part] = Field(min_length=1)

    @body_rule(mode="wrap")
    @classmethod
    def _model_turn(cls, data: Any, handler: Any, info: ValidationInfo) -> Any:
        context = info.context
        if not (isinstance(data, dict) and data.get("role") == "model" and isinstance(context, dict)):
            return handler(data)
        context[IN_MODEL_TURN] = True
        try:
            return handler(data)
        finally:
            context.pop(IN_MODEL_TURN, None)


class ImageConfig(Strict):
    imageSize: str | None = None
    aspectRatio: str | None = None

    _size = field_rule("imageSize")(classmethod(lambda cls, v: check_size(v)))

    @body_rule(mode="after")
    def _ratio(self, info: ValidationInfo) -> ImageConfig:
        check_ratio((info.context or {}).get("model"), self.aspectRatio)
        return self


class GenerationConfig(Strict):
    responseModalities: list[Literal["IMAGE"]] | None = Field(default=None, min_length=1, max_length=1)
    candidateCount: StrictInt | None = None
    imageConfig: ImageConfig | None = None

    _one = field_rule("candidateCount")(classmethod(lambda cls, v: only_integer_one(v, "candidateCount")))


class NativeRequest(Strict):
    """Body of `POST /v1beta/models/{model}:generateContent`; validate it with `native_request`."""

    contents: list[Content] = Field(min_length=1)
    generationConfig: GenerationConfig | None = None


def native_request(body: Any, model: str) -> NativeRequest:
    """`body` read for `model` (the path's model: its ratios decide `aspectRatio`)."""
    return NativeRequest.model_validate(body, context={"model": model})


# --- chat route ------------------------------------------------------------------------------------


class ChatImageConfig(Strict):
    image_size: str | None = None
    aspect_ratio: str | None = None

    _size = field_rule("image_size")(classmethod(lambda cls, v: check_size(v)))


class ChatNative(Strict):
    image_config: ChatImageConfig | None = None


class ChatMessage(Open):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(Open):
    """Body of `POST /v1/chat/completions`. Keys beyond the spec's pass, except those that mean a wrong
    nesting or a feature the spec lists as unsupported (docs/emulator.md)."""

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    n: Literal[1] | None = None
    stream: Literal[False] | None = None
    native: ChatNative | None = None

    _n = field_rule("n", mode="before")(classmethod(lambda cls, v: only_integer_one(v, "n")))

    @field_rule("stream", mode="before")
    @classmethod
    def _boolean(cls, v: Any) -> Any:
        if v is not None and v is not False:
            raise bad("stream must be the boolean false")
        return v

    @body_rule(mode="before")
    @classmethod
    def _keys(cls, data: Any) -> Any:
        for key in data if isinstance(data, dict) else ():
            if key in CHAT_MISNESTED_KEYS:
                raise bad(f"{key} is not used on the chat route; image options go in native.image_config")
            if key in CHAT_UNSUPPORTED_KEYS:
                raise bad(f"{key} is not supported by this service")
        return data

    @body_rule(mode="after")
    def _model_and_ratio(self) -> ChatRequest:
        served(Route.CHAT, self.model)
        if self.native and self.native.image_config:
            check_ratio(self.model, self.native.image_config.aspect_ratio)
        return self


# --- images routes ---------------------------------------------------------------------------------


class ImagesRequest(Strict):
    """The fields of `POST /v1/images/generations` (JSON) and `/v1/images/edits` (multipart). `model` is
    marked both required and "(default)": the default is taken when it is omitted."""

    model: str = COMPAT_IMAGE_MODEL
    prompt: str = Field(min_length=1)
    n: Literal[1] = 1
    size: str = DEFAULT_IMAGES_SIZE
    response_format: Literal["b64_json"] = "b64_json"
    output_format: Literal["png"] = "png"

    _n = field_rule("n", mode="before")(classmethod(lambda cls, v: only_integer_one(v, "n")))
    _model = field_rule("model")(classmethod(lambda cls, v: served(Route.IMAGES_GENERATIONS, v)))

    @field_rule("size")
    @classmethod
    def _size(cls, v: str) -> str:
        if v not in IMAGES_SIZES:
            raise bad(f"size must be one of {', '.join(IMAGES_SIZES)}, not {v!r}")
        return v


# --- text relay routes -----------------------------------------------------------------------------


class MessagesMessage(Open):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(Open):
    """Body of `POST /v1/messages`; `max_tokens` is marked both required and "default 1024": the default
    is taken when it is omitted."""

    model: str = Field(min_length=1)
    max_tokens: StrictInt = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    messages: list[MessagesMessage] = Field(min_length=1)

    _model = field_rule("model")(classmethod(lambda cls, v: served(Route.MESSAGES, v)))


class ResponsesRequest(Open):
    """Body of `POST /v1/responses`."""

    model: str = Field(min_length=1)
    input: str = Field(min_length=1)

    _model = field_rule("model")(classmethod(lambda cls, v: served(Route.RESPONSES, v)))


def refused(exc: ValidationError) -> tuple[int, str, str]:
    """(status, code, message) of the first error: a model outside the set is a 404, the rest 400."""
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-"))
    code = (
        first["type"] if first["type"] in ("unsupported_endpoint", "model_not_found") else "invalid_request"
    )
    if first["type"] == "extra_forbidden":
        message = f"unknown field {where!r}"
    elif first["type"] == "missing":
        message = f"missing required field {where!r}"
    else:
        message = f"{where}: {first['msg']}" if where else first["msg"]
    return (404 if code == "model_not_found" else 400), code, message
