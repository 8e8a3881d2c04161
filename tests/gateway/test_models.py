"""The spec's request rules as a table: each body is valid or names the offending field when refused."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from helpers.images import b64, jpeg, png
from pydantic import BaseModel, ValidationError

from imagebatch.gateway.compat_models import ChatRequest, ImagesRequest, MessagesRequest, ResponsesRequest
from imagebatch.gateway.constants import ASPECT_RATIOS
from imagebatch.gateway.errors import ErrorBody
from imagebatch.gateway.models import (
    describe_validation_error,
    validate_native_request,
)

PNG64 = b64(png(8, 8))
JPEG64 = b64(jpeg(8, 8))

# Written out here rather than read from constants, so a wrong table in the code is caught.
TEN = ["1:1", "2:3", "3:2", "3:4", "4:3", "4:5", "5:4", "9:16", "16:9", "21:9"]
FOURTEEN = [*TEN, "1:4", "4:1", "1:8", "8:1"]
RATIOS = {"native-image-pro": TEN, "native-image-2": FOURTEEN, "native-image-2.1": FOURTEEN}
ALL_RATIOS_AND_SOME_WRONG = [*FOURTEEN, "2:1", "1:2", "16:10", "1:1 ", "auto"]


def refusal(validate: Any, body: Any) -> tuple[str, str]:
    with pytest.raises(ValidationError) as info:
        validate(body)
    return describe_validation_error(info.value)


# --- native ---------------------------------------------------------------------------------------------


def native(*parts: dict[str, Any], gc: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "contents": [{"role": "user", "parts": list(parts) or [{"text": "a cat"}]}],
        **top,
    }
    if gc is not None:
        body["generationConfig"] = gc
    return body


def inline(data: str, mime: str = "image/png") -> dict[str, Any]:
    return {"inlineData": {"mimeType": mime, "data": data}}


@pytest.mark.parametrize("model", list(RATIOS))
@pytest.mark.parametrize("ratio", ALL_RATIOS_AND_SOME_WRONG)
def test_native_aspect_ratio_per_model(model: str, ratio: str) -> None:
    body = native(gc={"imageConfig": {"aspectRatio": ratio, "imageSize": "1K"}})
    if ratio in RATIOS[model]:
        validate_native_request(body, model)
    else:
        code, message = refusal(lambda b: validate_native_request(b, model), body)
        assert code == "invalid_request"
        assert message.startswith("generationConfig.imageConfig")
        assert ratio in message and model in message


def test_capability_table_has_ten_and_fourteen_ratios() -> None:
    assert {m: sorted(r) for m, r in ASPECT_RATIOS.items()} == {m: sorted(r) for m, r in RATIOS.items()}


VALID_NATIVE = {
    "text only": native(),
    "image and text": native({"text": "edit"}, inline(PNG64)),
    "jpeg": native(inline(JPEG64, "image/jpeg"), {"text": "edit"}),
    "all generation config": native(
        gc={
            "responseModalities": ["IMAGE"],
            "candidateCount": 1,
            "imageConfig": {"imageSize": "4K", "aspectRatio": "21:9"},
        }
    ),
    "each size": native(gc={"imageConfig": {"imageSize": "2K"}}),
    "role omitted": {"contents": [{"parts": [{"text": "x"}]}]},
    "history with signatures and extra part keys": {
        "contents": [
            {"role": "user", "parts": [{"text": "a cat"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "plan", "thought": True, "thoughtSignature": "c2ln"},
                    {**inline(PNG64), "thoughtSignature": "c2ln", "videoMetadata": None},
                ],
            },
            {"role": "user", "parts": [{"text": "bluer"}]},
        ]
    },
}


@pytest.mark.parametrize("body", VALID_NATIVE.values(), ids=VALID_NATIVE.keys())
def test_valid_native_bodies(body: dict[str, Any]) -> None:
    validate_native_request(body, "native-image-pro")


INVALID_NATIVE: dict[str, tuple[dict[str, Any], str]] = {
    "empty contents": ({"contents": []}, "contents"),
    "no contents": ({}, "missing required field 'contents'"),
    "empty parts": ({"contents": [{"parts": []}]}, "contents.0.parts"),
    "unknown top-level n": (native(n=1), "unknown field 'n'"),
    "unknown top-level tools": (native(tools=[]), "unknown field 'tools'"),
    "cachedContent": (native(cachedContent="c/1"), "unknown field 'cachedContent'"),
    "unknown content key": (
        {"contents": [{"role": "user", "parts": [{"text": "x"}], "text": "x"}]},
        "unknown field 'contents.0.text'",
    ),
    "role system": ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "contents.0.role"),
    "text and image in one part": (
        native({"text": "x", **inline(PNG64)}),
        "contents.0.parts.0: each part must carry exactly one of text or inlineData",
    ),
    "part with neither": (native({"thought": True}), "contents.0.parts.0"),
    "fileData": (native({"fileData": {"fileUri": "gs://b/x.png"}}), "fileData is not supported"),
    "webp": (native(inline(PNG64, "image/webp")), "contents.0.parts.0.inlineData.mimeType"),
    "data url prefix": (native(inline("data:image/png;base64," + PNG64)), "without a data-URL prefix"),
    "bad base64": (native(inline(PNG64[:-3] + "!!!")), "not valid base64"),
    "base64 with newline": (native(inline(PNG64[:20] + "\n" + PNG64[20:])), "not valid base64"),
    "png declared jpeg": (native(inline(PNG64, "image/jpeg")), "is image/png, but mimeType says image/jpeg"),
    "not an image": (native(inline(base64.b64encode(b"hello").decode())), "not a PNG or JPEG image"),
    "image url": (native({"inlineData": {"mimeType": "image/png", "url": "http://x"}}), "inlineData"),
    "lowercase 1k": (native(gc={"imageConfig": {"imageSize": "1k"}}), "did you mean '1K'?"),
    "8K": (native(gc={"imageConfig": {"imageSize": "8K"}}), "generationConfig.imageConfig.imageSize"),
    "candidateCount 2": (native(gc={"candidateCount": 2}), "generationConfig.candidateCount"),
    "candidateCount True": (native(gc={"candidateCount": True}), "generationConfig.candidateCount"),
    "candidateCount 1.0": (native(gc={"candidateCount": 1.0}), "generationConfig.candidateCount"),
    "candidateCount '1'": (native(gc={"candidateCount": "1"}), "generationConfig.candidateCount"),
    "modalities TEXT": (native(gc={"responseModalities": ["TEXT"]}), "generationConfig.responseModalities"),
    "modalities TEXT+IMAGE": (
        native(gc={"responseModalities": ["TEXT", "IMAGE"]}),
        "generationConfig.responseModalities",
    ),
    "modalities empty": (native(gc={"responseModalities": []}), "generationConfig.responseModalities"),
    "modalities lowercase": (
        native(gc={"responseModalities": ["image"]}),
        "generationConfig.responseModalities",
    ),
    "responseMimeType": (native(gc={"responseMimeType": "image/png"}), "'generationConfig.responseMimeType'"),
    "imageConfig extra": (
        native(gc={"imageConfig": {"numberOfImages": 2}}),
        "'generationConfig.imageConfig.numberOfImages'",
    ),
}


@pytest.mark.parametrize(("body", "names"), INVALID_NATIVE.values(), ids=INVALID_NATIVE.keys())
def test_invalid_native_bodies_name_the_field(body: dict[str, Any], names: str) -> None:
    code, message = refusal(lambda b: validate_native_request(b, "native-image-2"), body)
    assert code == "invalid_request"
    assert names in message


# --- chat -----------------------------------------------------------------------------------------------


def chat(**changes: Any) -> dict[str, Any]:
    return {"model": "native-image-2", "messages": [{"role": "user", "content": "a cat"}], **changes}


VALID_CHAT = {
    "minimal": chat(),
    "n 1 and stream false": chat(n=1, stream=False),
    "image config": chat(native={"image_config": {"image_size": "4K", "aspect_ratio": "1:8"}}),
    "pro ratio": chat(model="native-image-pro", native={"image_config": {"aspect_ratio": "21:9"}}),
    "unlisted fields pass": chat(temperature=0.2, user="u1"),
}


@pytest.mark.parametrize("body", VALID_CHAT.values(), ids=VALID_CHAT.keys())
def test_valid_chat_bodies(body: dict[str, Any]) -> None:
    ChatRequest.model_validate(body)


INVALID_CHAT: dict[str, tuple[dict[str, Any], str, str]] = {
    "generationConfig": (chat(generationConfig={}), "invalid_request", "native.image_config"),
    "n 2": (chat(n=2), "invalid_request", "n"),
    "n True": (chat(n=True), "invalid_request", "n"),
    "n 1.0": (chat(n=1.0), "invalid_request", "n"),
    "stream true": (chat(stream=True), "invalid_request", "stream"),
    "stream 0": (chat(stream=0), "invalid_request", "stream"),
    "compat model": (chat(model="compat-image-2"), "invalid_request", "compat-image-2"),
    "lowercase size": (chat(native={"image_config": {"image_size": "1k"}}), "invalid_request", "image_size"),
    "ratio for pro": (
        chat(model="native-image-pro", native={"image_config": {"aspect_ratio": "1:8"}}),
        "invalid_request",
        "1:8",
    ),
    "image_config extra": (
        chat(native={"image_config": {"imageSize": "1K"}}),
        "invalid_request",
        "'native.image_config.imageSize'",
    ),
    "no messages": (chat(messages=[]), "invalid_request", "messages"),
    "content not a string": (
        chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        "invalid_request",
        "messages.0.content",
    ),
}


@pytest.mark.parametrize(("body", "code", "names"), INVALID_CHAT.values(), ids=INVALID_CHAT.keys())
def test_invalid_chat_bodies_name_the_field(body: dict[str, Any], code: str, names: str) -> None:
    got_code, message = refusal(ChatRequest.model_validate, body)
    assert got_code == code
    assert names in message


# --- images ---------------------------------------------------------------------------------------------

IMAGES_SIZES = [
    "auto", "1024x1024", "2048x2048", "1536x1024", "1024x1536",
    "1536x1152", "1152x1536", "2048x1152", "3840x2160", "2160x3840",
]  # fmt: skip


@pytest.mark.parametrize("size", IMAGES_SIZES)
def test_images_sizes(size: str) -> None:
    assert ImagesRequest.model_validate({"prompt": "x", "size": size}).size == size


def test_images_defaults() -> None:
    assert ImagesRequest.model_validate({"prompt": "x"}).model_dump() == {
        "model": "compat-image-2",
        "prompt": "x",
        "n": 1,
        "size": "1024x1024",
        "response_format": "b64_json",
        "output_format": "png",
    }


INVALID_IMAGES: dict[str, tuple[dict[str, Any], str, str]] = {
    "native model": ({"model": "native-image-2"}, "unsupported_endpoint", "native-image-2"),
    "unknown model": ({"model": "dall-e-3"}, "model_not_found", "dall-e-3"),
    "n 2": ({"n": 2}, "invalid_request", "n"),
    "n True": ({"n": True}, "invalid_request", "n"),
    "n 1.0": ({"n": 1.0}, "invalid_request", "n"),
    "size uppercase X": ({"size": "1024X1024"}, "invalid_request", "size"),
    "size 512": ({"size": "512x512"}, "invalid_request", "size"),
    "url format": ({"response_format": "url"}, "invalid_request", "response_format"),
    "jpeg output": ({"output_format": "jpeg"}, "invalid_request", "output_format"),
    "webp output": ({"output_format": "webp"}, "invalid_request", "output_format"),
    "empty prompt": ({"prompt": ""}, "invalid_request", "prompt"),
}


@pytest.mark.parametrize(("changes", "code", "names"), INVALID_IMAGES.values(), ids=INVALID_IMAGES.keys())
def test_invalid_images_bodies_name_the_field(changes: dict[str, Any], code: str, names: str) -> None:
    got_code, message = refusal(ImagesRequest.model_validate, {"prompt": "a cat", **changes})
    assert got_code == code
    assert names in message


# --- text relay routes ----------------------------------------------------------------------------------

MSGS = [{"role": "user", "content": "hi"}]


def test_messages_default_max_tokens_and_passthrough() -> None:
    body = MessagesRequest.model_validate({"model": "text-a", "messages": MSGS, "system": "be brief"})
    assert body.model_dump(exclude_none=True) == {
        "model": "text-a",
        "max_tokens": 1024,
        "messages": MSGS,
        "system": "be brief",
    }


@pytest.mark.parametrize(
    ("model_cls", "body", "names"),
    [
        (MessagesRequest, {"model": "text-a", "max_tokens": 0, "messages": MSGS}, "max_tokens"),
        (MessagesRequest, {"model": "text-a", "max_tokens": True, "messages": MSGS}, "max_tokens"),
        (MessagesRequest, {"model": "text-a", "messages": []}, "messages"),
        (MessagesRequest, {"messages": MSGS}, "missing required field 'model'"),
        (MessagesRequest, {"model": "native-image-2", "messages": MSGS}, "image model"),
        (ResponsesRequest, {"model": "text-b"}, "missing required field 'input'"),
        (ResponsesRequest, {"model": "text-b", "input": ""}, "input"),
        (ResponsesRequest, {"model": "compat-image-2", "input": "hi"}, "image model"),
    ],
)
def test_invalid_text_bodies_name_the_field(
    model_cls: type[BaseModel], body: dict[str, Any], names: str
) -> None:
    _, message = refusal(model_cls.model_validate, body)
    assert names in message


def test_valid_responses_body_passes_unlisted_fields() -> None:
    body = ResponsesRequest.model_validate({"model": "text-b", "input": "hi", "reasoning": {"effort": "low"}})
    assert body.model_dump() == {"model": "text-b", "input": "hi", "reasoning": {"effort": "low"}}


# --- error body and the description of a refusal ---------------------------------------------------------


def test_error_body_model() -> None:
    body = ErrorBody.model_validate(
        {
            "error": {"message": "m", "type": "invalid_request_error", "code": "invalid_request"},
            "message": "top",
        }
    )
    assert body.error is not None
    assert (body.error.message, body.error.type, body.error.code, body.message) == (
        "m",
        "invalid_request_error",
        "invalid_request",
        "top",
    )


def test_describe_validation_error_names_the_json_path() -> None:
    with pytest.raises(ValidationError) as info:
        validate_native_request(
            native({"text": "ok"}, gc={"imageConfig": {"imageSize": "4k"}}), "native-image-2"
        )
    assert describe_validation_error(info.value) == (
        "invalid_request",
        "generationConfig.imageConfig.imageSize: image size must be one of 1K, 2K, 4K (case-sensitive), "
        "not '4k' (did you mean '4K'?)",
    )


# --- review additions: nesting, unsupported chat features, explicit nulls, model-turn parts ---------------


@pytest.mark.parametrize(
    "key", ["image_config", "imageConfig", "extra_body", "generationConfig", "tools", "response_format"]
)
def test_chat_refuses_misnested_and_unsupported_keys(key: str) -> None:
    body = {"model": "native-image-pro", "messages": [{"role": "user", "content": "x"}], key: {}}
    with pytest.raises(ValidationError) as info:
        ChatRequest.model_validate(body)
    code, message = describe_validation_error(info.value)
    assert code == "invalid_request" and key in message


def test_chat_accepts_ordinary_extra_keys() -> None:
    body = {"model": "native-image-pro", "messages": [{"role": "user", "content": "x"}], "temperature": 0.2}
    assert ChatRequest.model_validate(body).model == "native-image-pro"


@pytest.mark.parametrize(
    "config",
    [
        {"candidateCount": None},
        {"responseModalities": None},
        {"imageConfig": None},
        {"imageConfig": {"imageSize": None}},
    ],
)
def test_explicit_nulls_are_refused(config: dict[str, Any]) -> None:
    body = {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": config}
    with pytest.raises(ValidationError) as info:
        validate_native_request(body, "native-image-2")
    assert "null" in describe_validation_error(info.value)[1]


def test_a_model_turn_part_may_carry_only_a_signature_but_a_user_part_may_not() -> None:
    model_turn = {"role": "model", "parts": [{"thoughtSignature": "s"}, {"text": "here"}]}
    body = {"contents": [{"parts": [{"text": "x"}]}, model_turn, {"parts": [{"text": "again"}]}]}
    assert len(validate_native_request(body, "native-image-2").contents) == 3
    with pytest.raises(ValidationError):
        validate_native_request({"contents": [{"parts": [{"thoughtSignature": "s"}]}]}, "native-image-2")
    both = {"role": "model", "parts": [{"text": "t", "inlineData": {"mimeType": "image/png", "data": ""}}]}
    with pytest.raises(ValidationError):
        validate_native_request({"contents": [{"parts": [{"text": "x"}]}, both]}, "native-image-2")
