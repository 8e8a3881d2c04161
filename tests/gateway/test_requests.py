"""GatewayClient requests (against the shared fake service): paths, bodies, auth, headers, the
idempotency key, and what is refused before anything is sent (its configuration: test_client_config.py)."""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from helpers.fake_gateway import (
    ALL_ROUTES,
    BASE,
    CHAT_REQUEST,
    EXPECTED_PATHS,
    IDEM,
    IMAGES_REQUEST,
    JPEG,
    KEY,
    MASK,
    MESSAGES_REQUEST,
    NATIVE_REQUEST,
    PNG,
    PNG_WIDE,
    RESPONSES_REQUEST,
    RETRYING_ROUTES,
    ROUTES,
    SINGLE_ATTEMPT_ROUTES,
    FakeService,
    FormPart,
    Reply,
    b64,
    image_part,
    parse_multipart,
    sent_json,
    text_part,
)

from imagebatch.gateway import (
    ImageUpload,
)
from imagebatch.gateway.errors import (
    RequestValidationError,
)
from imagebatch.gateway.models import NativeRequest

# === request shape =======================================================================================


@pytest.mark.parametrize("name", ALL_ROUTES)
def test_every_route_posts_to_its_path(service: FakeService, name: str) -> None:
    case = ROUTES[name]
    case(service.reply(case.ok).client())
    assert service.request.method == "POST"
    assert service.request.url == f"{BASE}{EXPECTED_PATHS[name]}"


@pytest.mark.parametrize("model", ["native-image-pro", "native-image-2", "native-image-2.1"])
def test_native_model_goes_in_the_path(service: FakeService, model: str) -> None:
    service.reply(ROUTES["native"].ok).client().generate_content(
        model, {"contents": [{"parts": [{"text": "x"}]}]}, idempotency_key=IDEM
    )
    assert service.request.url.raw_path.decode() == f"/v1beta/models/{model}:generateContent"


def test_native_body_is_contents_and_generation_config_only(service: FakeService) -> None:
    ROUTES["native"](service.reply(ROUTES["native"].ok).client())
    assert sent_json(service.request) == {
        "contents": [{"role": "user", "parts": [{"text": "a red square"}]}],
        "generationConfig": {
            "responseModalities": ["IMAGE"],
            "candidateCount": 1,
            "imageConfig": {"imageSize": "2K", "aspectRatio": "16:9"},
        },
    }


def test_native_reference_images_are_separate_parts_with_original_bytes(service: FakeService) -> None:
    request = {
        "contents": [
            {"role": "user", "parts": [text_part("blend"), image_part(PNG), image_part(JPEG, "image/jpeg")]}
        ]
    }
    service.reply(ROUTES["native"].ok).client().generate_content(
        "native-image-2.1", request, idempotency_key=IDEM
    )
    parts = sent_json(service.request)["contents"][0]["parts"]
    assert parts == [
        {"text": "blend"},
        {"inlineData": {"mimeType": "image/png", "data": b64(PNG)}},
        {"inlineData": {"mimeType": "image/jpeg", "data": b64(JPEG)}},
    ]
    assert base64.b64decode(parts[2]["inlineData"]["data"]) == JPEG


def test_native_accepts_a_model_instance(service: FakeService) -> None:
    body = NativeRequest.model_validate(NATIVE_REQUEST)
    service.reply(ROUTES["native"].ok).client().generate_content("native-image-2", body, idempotency_key=IDEM)
    assert sent_json(service.request)["generationConfig"]["imageConfig"] == {
        "imageSize": "2K",
        "aspectRatio": "16:9",
    }


def test_native_edit_history_sends_the_model_turn_unaltered(service: FakeService) -> None:
    returned_content = {
        "role": "model",
        "parts": [
            {"text": "planning the edit", "thought": True, "thoughtSignature": "c2lnLTE="},
            {"text": "Here it is.", "thoughtSignature": "c2lnLTI+/w=="},
            {"inlineData": {"mimeType": "image/png", "data": b64(PNG)}, "thoughtSignature": "c2lnLTM="},
        ],
    }
    answer = {"candidates": [{"content": returned_content, "finishReason": "STOP"}]}
    client = service.reply(Reply(json=answer), ROUTES["native"].ok).client()
    first = client.generate_content(
        "native-image-2", {"contents": [{"parts": [text_part("a cat")]}]}, idempotency_key="k1"
    )
    assert first.model_content == returned_content

    history = {
        "contents": [
            {"role": "user", "parts": [text_part("a cat")]},
            first.model_content,
            {"role": "user", "parts": [text_part("make it blue")]},
        ]
    }
    client.generate_content("native-image-2", history, idempotency_key="k2")
    sent = sent_json(service.requests[1])["contents"]
    assert sent[1] == returned_content  # same parts, same order, signatures byte for byte
    assert [p.get("thoughtSignature") for p in sent[1]["parts"]] == ["c2lnLTE=", "c2lnLTI+/w==", "c2lnLTM="]


def test_chat_body_uses_native_image_config(service: FakeService) -> None:
    body = {**CHAT_REQUEST, "n": 1, "stream": False}
    service.reply(ROUTES["chat"].ok).client().chat_completions(body, idempotency_key=IDEM)
    sent = sent_json(service.request)
    assert sent == {
        "model": "native-image-2",
        "messages": [{"role": "user", "content": "a red square"}],
        "n": 1,
        "stream": False,
        "native": {"image_config": {"image_size": "2K", "aspect_ratio": "4:1"}},
    }
    assert "generationConfig" not in sent


def test_images_generation_body_carries_every_field(service: FakeService) -> None:
    ROUTES["images_generations"](service.reply(ROUTES["images_generations"].ok).client())
    assert sent_json(service.request) == {
        "model": "compat-image-2",
        "prompt": "a red square",
        "n": 1,
        "size": "1536x1024",
        "response_format": "b64_json",
        "output_format": "png",
    }


EDIT_FIELDS = {
    "model": b"compat-image-2",
    "prompt": b"a red square",
    "n": b"1",
    "size": b"1536x1024",
    "response_format": b"b64_json",
    "output_format": b"png",
}


def test_images_edit_with_one_file_sends_field_image(service: FakeService) -> None:
    service.reply(ROUTES["images_edits"].ok).client().images_edit(
        IMAGES_REQUEST, [ImageUpload(PNG, "ref.png")], idempotency_key=IDEM
    )
    parts = parse_multipart(service.request)
    assert {p.name: p.value for p in parts if p.filename is None} == EDIT_FIELDS
    files = [p for p in parts if p.filename is not None]
    assert files == [FormPart("image", "ref.png", "image/png", PNG)]


def test_images_edit_with_several_files_repeats_image_brackets_and_one_mask(service: FakeService) -> None:
    service.reply(ROUTES["images_edits"].ok).client().images_edit(
        IMAGES_REQUEST,
        [ImageUpload(PNG, "a.png"), ImageUpload(JPEG, "b.jpg", "image/jpeg"), ImageUpload(PNG_WIDE, "c.png")],
        mask=ImageUpload(MASK, "mask.png"),
        idempotency_key=IDEM,
    )
    parts = parse_multipart(service.request)
    assert {p.name: p.value for p in parts if p.filename is None} == EDIT_FIELDS
    files = [p for p in parts if p.filename is not None]
    assert files == [
        FormPart("image[]", "a.png", "image/png", PNG),
        FormPart("image[]", "b.jpg", "image/jpeg", JPEG),
        FormPart("image[]", "c.png", "image/png", PNG_WIDE),
        FormPart("mask", "mask.png", "image/png", MASK),
    ]


def test_images_edit_is_not_json(service: FakeService) -> None:
    ROUTES["images_edits"](service.reply(ROUTES["images_edits"].ok).client())
    assert service.request.headers["content-type"].startswith("multipart/form-data; boundary=")


def test_messages_body_and_default_max_tokens(service: FakeService) -> None:
    client = service.reply(ROUTES["messages"].ok).client()
    client.messages(MESSAGES_REQUEST, idempotency_key="a")
    client.messages(
        {"model": "text-model-a", "messages": [{"role": "user", "content": "hi"}]}, idempotency_key="b"
    )
    assert sent_json(service.requests[0]) == MESSAGES_REQUEST
    assert sent_json(service.requests[1])["max_tokens"] == 1024


def test_responses_body(service: FakeService) -> None:
    ROUTES["responses"](service.reply(ROUTES["responses"].ok).client())
    assert sent_json(service.request) == RESPONSES_REQUEST


# === auth ================================================================================================


def test_native_auth_default_is_the_native_key_header_only(service: FakeService) -> None:
    ROUTES["native"](service.reply(ROUTES["native"].ok).client())
    headers = service.request.headers
    assert headers["x-native-api-key"] == KEY
    assert "authorization" not in headers
    assert "x-api-key" not in headers


def test_native_auth_bearer_when_asked_and_never_both(service: FakeService) -> None:
    ROUTES["native"](service.reply(ROUTES["native"].ok).client(native_auth="bearer"))
    headers = service.request.headers
    assert headers["authorization"] == f"Bearer {KEY}"
    assert "x-native-api-key" not in headers


@pytest.mark.parametrize("name", ["chat", "images_generations", "images_edits", "responses"])
def test_bearer_only_routes(service: FakeService, name: str) -> None:
    ROUTES[name](service.reply(ROUTES[name].ok).client())
    headers = service.request.headers
    assert headers["authorization"] == f"Bearer {KEY}"
    assert "x-native-api-key" not in headers
    assert "x-api-key" not in headers


def test_messages_auth_is_x_api_key_and_compat_version_never_bearer(service: FakeService) -> None:
    ROUTES["messages"](service.reply(ROUTES["messages"].ok).client())
    headers = service.request.headers
    assert headers["x-api-key"] == KEY
    assert re.fullmatch(r"[A-Za-z0-9._-]+/2\.0\.76 \(external, cli\)", headers["compat-version"])
    assert "authorization" not in headers
    assert "x-native-api-key" not in headers


def test_messages_compat_version_is_configurable(service: FakeService) -> None:
    ROUTES["messages"](
        service.reply(ROUTES["messages"].ok).client(compat_version="mytool/2.0.76 (external, cli)")
    )
    assert service.request.headers["compat-version"] == "mytool/2.0.76 (external, cli)"


# === X-Service-Max-Images ================================================================================


@pytest.mark.parametrize("name", SINGLE_ATTEMPT_ROUTES)
@pytest.mark.parametrize("value", [1, 2, 3, 4])
def test_max_images_header_is_sent_on_native_and_chat(service: FakeService, name: str, value: int) -> None:
    ROUTES[name](service.reply(ROUTES[name].ok).client(), max_images=value)
    assert service.request.headers["X-Service-Max-Images"] == str(value)


@pytest.mark.parametrize("name", ALL_ROUTES)
def test_max_images_header_absent_unless_given(service: FakeService, name: str) -> None:
    ROUTES[name](service.reply(ROUTES[name].ok).client())
    assert "x-service-max-images" not in service.request.headers


@pytest.mark.parametrize("name", SINGLE_ATTEMPT_ROUTES)
@pytest.mark.parametrize("value", [0, 5, -1, True, False, 2.0, "2"])
def test_max_images_out_of_range_is_refused_before_sending(
    service: FakeService, name: str, value: Any
) -> None:
    with pytest.raises(RequestValidationError, match="X-Service-Max-Images"):
        ROUTES[name](service.reply(ROUTES[name].ok).client(), max_images=value)
    assert service.requests == []


# === Idempotency-Key =====================================================================================


@pytest.mark.parametrize("name", ALL_ROUTES)
def test_idempotency_key_is_sent_on_every_route(service: FakeService, name: str) -> None:
    ROUTES[name](service.reply(ROUTES[name].ok).client(), idempotency_key="row-42:1:abc")
    assert service.request.headers["Idempotency-Key"] == "row-42:1:abc"


@pytest.mark.parametrize("name", RETRYING_ROUTES)
def test_idempotency_key_is_the_same_on_every_attempt(service: FakeService, name: str) -> None:
    service.reply(Reply(503), Reply(error=httpx.ConnectError), Reply(429), ROUTES[name].ok)
    result = ROUTES[name](service.client(), idempotency_key="row-42:1:abc")
    assert result.attempts == 4
    assert [r.headers["Idempotency-Key"] for r in service.requests] == ["row-42:1:abc"] * 4


@pytest.mark.parametrize("name", ALL_ROUTES)
def test_missing_idempotency_key_is_refused(service: FakeService, name: str) -> None:
    with pytest.raises(RequestValidationError, match="idempotency"):
        ROUTES[name](service.reply(ROUTES[name].ok).client(), idempotency_key="")
    assert service.requests == []


# === client-side validation: nothing is sent =============================================================


def native_with(model: str = "native-image-2", **changes: Any) -> Callable[..., Any]:
    body = {**copy.deepcopy(NATIVE_REQUEST), **changes}
    return lambda c, **kw: c.generate_content(model, body, **kw)


def native_part(part: dict[str, Any]) -> Callable[..., Any]:
    return native_with(contents=[{"parts": [text_part("x"), part]}])


def native_gc(**gc: Any) -> Callable[..., Any]:
    return native_with(generationConfig=gc)


def chat_with(**changes: Any) -> Callable[..., Any]:
    return lambda c, **kw: c.chat_completions({**CHAT_REQUEST, **changes}, **kw)


def images_with(**changes: Any) -> Callable[..., Any]:
    return lambda c, **kw: c.images_generate({**IMAGES_REQUEST, **changes}, **kw)


INVALID_REQUESTS: list[tuple[str, Callable[..., Any], str]] = [
    ("native unknown model", native_with(model="native-image-3"), "not a native image model"),
    ("native root n", native_with(n=1), "unknown field 'n'"),
    ("native tools", native_with(tools=[{"googleSearch": {}}]), "unknown field 'tools'"),
    ("native empty contents", native_with(contents=[]), "contents"),
    ("native empty parts", native_with(contents=[{"parts": []}]), "contents.0.parts"),
    ("native fileData", native_part({"fileData": {"fileUri": "gs://x"}}), "fileData"),
    (
        "native data url",
        native_part({"inlineData": {"mimeType": "image/png", "data": f"data:image/png;base64,{b64(PNG)}"}}),
        "data-URL",
    ),
    ("native mime mismatch", native_part(image_part(JPEG, "image/png")), "mimeType says image/png"),
    (
        "native ratio for model",
        native_with(model="native-image-pro", generationConfig={"imageConfig": {"aspectRatio": "8:1"}}),
        "8:1",
    ),
    ("native lowercase size", native_gc(imageConfig={"imageSize": "1k"}), "'1K'"),
    ("native candidateCount", native_gc(candidateCount=2), "candidateCount"),
    ("native modalities", native_gc(responseModalities=["TEXT", "IMAGE"]), "responseModalities"),
    ("native responseMimeType", native_gc(responseMimeType="image/png"), "generationConfig.responseMimeType"),
    ("chat generationConfig", chat_with(generationConfig={}), "generationConfig"),
    ("chat n", chat_with(n=2), "n"),
    ("chat image model", chat_with(model="compat-image-2"), "compat-image-2"),
    ("chat ratio", chat_with(model="native-image-pro"), "4:1"),
    ("chat lowercase size", chat_with(native={"image_config": {"image_size": "2k"}}), "'2K'"),
    ("images native model", images_with(model="native-image-2"), "native-image-2"),
    ("images n", images_with(n=2), "n"),
    ("images size", images_with(size="512x512"), "size"),
    ("images format", images_with(response_format="url"), "response_format"),
    ("images output", images_with(output_format="jpeg"), "output_format"),
    ("edit no image", lambda c, **kw: c.images_edit(IMAGES_REQUEST, [], **kw), "reference image"),
    (
        "messages max_tokens",
        lambda c, **kw: c.messages({**MESSAGES_REQUEST, "max_tokens": 0}, **kw),
        "max_tokens",
    ),
    ("messages empty", lambda c, **kw: c.messages({**MESSAGES_REQUEST, "messages": []}, **kw), "messages"),
    ("responses no input", lambda c, **kw: c.responses({"model": "text-model-b"}, **kw), "input"),
    (
        "responses image model",
        lambda c, **kw: c.responses({**RESPONSES_REQUEST, "model": "native-image-2"}, **kw),
        "image model",
    ),
]


@pytest.mark.parametrize(
    ("call", "fragment"), [c[1:] for c in INVALID_REQUESTS], ids=[c[0] for c in INVALID_REQUESTS]
)
def test_invalid_request_is_refused_and_nothing_is_sent(
    service: FakeService, call: Callable[..., Any], fragment: str
) -> None:
    client = service.reply(Reply()).client()
    with pytest.raises(RequestValidationError) as info:
        call(client, idempotency_key=IDEM, observer=service.observe)
    assert fragment in str(info.value)
    assert service.requests == []
    assert service.log == []


def test_validation_error_codes(service: FakeService) -> None:
    client = service.client()
    with pytest.raises(RequestValidationError) as info:
        images_with(model="native-image-2")(client, idempotency_key=IDEM)
    assert info.value.code == "unsupported_endpoint"
    with pytest.raises(RequestValidationError) as info:
        native_with(model="gpt-image")(client, idempotency_key=IDEM)
    assert info.value.code == "model_not_found"
    with pytest.raises(RequestValidationError) as info:
        native_gc(candidateCount=2)(client, idempotency_key=IDEM)
    assert info.value.code == "invalid_request"
    assert service.requests == []
