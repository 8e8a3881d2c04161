"""Pydantic models of the compatible routes' bodies, with the spec's rules as validators: chat
(`/v1/chat/completions`), images (`/v1/images/generations` and `/edits`) and the text relays
(`/v1/messages`, `/v1/responses`). The rules they share with the native route are `models`'.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictInt, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .constants import COMPAT_IMAGE_MODEL, DEFAULT_MAX_TOKENS, IMAGES_API_SIZES, Route
from .models import (
    OpenBody,
    StrictBody,
    check_aspect_ratio,
    check_image_size,
    check_served,
    reject_non_integer_one,
)

CHAT_MISNESTED_KEYS = ("image_config", "imageConfig", "extra_body", "generationConfig")
CHAT_UNSUPPORTED_KEYS = (
    "tools", "functions", "tool_choice", "function_call", "web_search_options", "response_format",
    "modalities", "stream_options", "audio",
)  # fmt: skip


# --- chat route --------------------------------------------------------------------------------------


class ChatImageConfig(StrictBody):
    image_size: str | None = None
    aspect_ratio: str | None = None

    _check_size = field_validator("image_size")(classmethod(lambda cls, v: check_image_size(v)))


class ChatNativeOptions(StrictBody):
    image_config: ChatImageConfig | None = None


class ChatMessage(OpenBody):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(OpenBody):
    """Body of `POST /v1/chat/completions`.

    Fields beyond those the spec lists are not shown by the spec; we accept and ignore ordinary ones that
    clients of this API commonly send (`temperature`, `user`, ...), but refuse with 400 the keys that mean
    wrong nesting (`image_config`, `imageConfig`, `extra_body`, `generationConfig`: the spec nests image
    options under `native.image_config`) or a feature the spec lists as unsupported (tools, function
    calling, search, structured output, streaming options, other modalities): ignoring those would
    silently produce something other than what the caller asked for.
    """

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    n: Literal[1] | None = None
    stream: Literal[False] | None = None
    native: ChatNativeOptions | None = None

    _strict_n = field_validator("n", mode="before")(classmethod(lambda cls, v: reject_non_integer_one(v)))

    @field_validator("stream", mode="before")
    @classmethod
    def _stream_is_bool(cls, v: Any) -> Any:
        # `Literal[False]` alone accepts 0 (0 == False); the spec's field is the boolean false.
        if v is not None and not isinstance(v, bool):
            raise PydanticCustomError("invalid_request", "stream must be the boolean false")
        return v

    @model_validator(mode="before")
    @classmethod
    def _no_misplaced_or_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in CHAT_MISNESTED_KEYS:
                if key in data:
                    raise PydanticCustomError(
                        "invalid_request",
                        "{key} is not used on the chat route; image options go in native.image_config",
                        {"key": key},
                    )
            for key in CHAT_UNSUPPORTED_KEYS:
                if key in data:
                    raise PydanticCustomError(
                        "invalid_request", "{key} is not supported by this service", {"key": key}
                    )
        return data

    @model_validator(mode="after")
    def _model_and_ratio(self) -> ChatRequest:
        check_served(Route.CHAT, self.model)
        if self.native and self.native.image_config:
            check_aspect_ratio(self.model, self.native.image_config.aspect_ratio)
        return self


class ChatResponseMessage(OpenBody):
    role: str = "assistant"
    content: str | None = None


class ChatChoice(OpenBody):
    message: ChatResponseMessage
    finish_reason: str | None = None


class ChatResponse(OpenBody):
    choices: list[ChatChoice] = Field(min_length=1)
    usage: dict[str, Any] | None = None


# --- images routes -----------------------------------------------------------------------------------

ImagesSize = Literal[tuple(IMAGES_API_SIZES)]  # type: ignore[valid-type]


class ImagesRequest(StrictBody):
    """Fields of `POST /v1/images/generations` (JSON) and of `POST /v1/images/edits` (multipart)."""

    model: str = COMPAT_IMAGE_MODEL
    """Only `compat-image-2`; a native model gets `unsupported_endpoint`. The spec marks it both
    "Required: yes" and "(default)"; we take the default when it is omitted (imagebatch always sends it)."""
    prompt: str = Field(min_length=1)
    """Description (generations) or edit instruction (edits)."""
    n: Literal[1] = 1
    size: ImagesSize = "1024x1024"  # type: ignore[valid-type]
    response_format: Literal["b64_json"] = "b64_json"
    output_format: Literal["png"] = "png"

    _strict_n = field_validator("n", mode="before")(classmethod(lambda cls, v: reject_non_integer_one(v)))

    @field_validator("model")
    @classmethod
    def _compat_model(cls, v: str) -> str:
        return check_served(Route.IMAGES_GENERATIONS, v)  # both images routes serve the same models


class ImagesDatum(OpenBody):
    b64_json: str


class ImagesResponse(OpenBody):
    created: int
    data: list[ImagesDatum] = Field(min_length=1)


# --- text relay routes -------------------------------------------------------------------------------


def check_text_model(v: str) -> str:
    """Image models are not text models: refuse them on the relay routes."""
    return check_served(Route.MESSAGES, v)  # both relay routes serve the same (any text) models


class MessagesMessage(OpenBody):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(OpenBody):
    """Body of `POST /v1/messages`. Fields beyond these three are not shown by the spec and pass through."""

    model: str = Field(min_length=1)
    max_tokens: StrictInt = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    """The spec marks it both "Required: yes" and "default 1024"; we take the default when it is omitted
    (imagebatch always sends it)."""
    messages: list[MessagesMessage] = Field(min_length=1)

    _text_model = field_validator("model")(classmethod(lambda cls, v: check_text_model(v)))


class ResponsesRequest(OpenBody):
    """Body of `POST /v1/responses`. Fields beyond `model` and `input` pass through."""

    model: str = Field(min_length=1)
    input: str = Field(min_length=1)

    _text_model = field_validator("model")(classmethod(lambda cls, v: check_text_model(v)))
