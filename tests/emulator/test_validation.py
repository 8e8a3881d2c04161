"""Emulator over real HTTP: every JSON body rule of the spec gets its 400 (or 404) in the spec's error body
(the edits route's multipart rules: test_validation_edits.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from helpers.emulator import (
    VALID_BODIES,
    assert_error,
    auth_headers,
    b64,
    http,
    jpeg,
    native_body,
    path_of,
    png,
    post,
)

from imagebatch.emulator import EmulatorServer
from imagebatch.gateway.constants import NATIVE_MODELS, Route

PNG = png(32, 32)
JPEG = jpeg(32, 32)


def image_part(data: bytes = PNG, mime: str = "image/png", **extra: Any) -> dict[str, Any]:
    return {"inlineData": {"mimeType": mime, "data": b64(data)}, **extra}


def native_with(**changes: Any) -> dict[str, Any]:
    """A valid native body with top-level keys replaced (None removes the key)."""
    body = copy.deepcopy(native_body())
    for key, value in changes.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def user(*parts: dict[str, Any], role: str | None = "user") -> dict[str, Any]:
    content: dict[str, Any] = {"parts": list(parts)}
    if role is not None:
        content["role"] = role
    return content


def config(**fields: Any) -> dict[str, Any]:
    return {"responseModalities": ["IMAGE"], **fields}


TEXT = {"text": "a red bicycle"}

# (id, body, model in the path) -> 400 invalid_request
NATIVE_400: list[tuple[str, Any, str]] = [
    ("unknown top-level key", native_with(safetySettings=[]), "native-image-2"),
    ("search tools", native_with(tools=[{"googleSearch": {}}]), "native-image-2"),
    ("root n", native_with(n=1), "native-image-2"),
    ("systemInstruction", native_with(systemInstruction={"parts": [TEXT]}), "native-image-2"),
    ("cachedContent", native_with(cachedContent="cachedContents/x"), "native-image-2"),
    ("previous_interaction_id", native_with(previous_interaction_id="x"), "native-image-2"),
    ("contents missing", native_with(contents=None), "native-image-2"),
    ("contents empty", native_with(contents=[]), "native-image-2"),
    ("contents not a list", native_with(contents={"parts": [TEXT]}), "native-image-2"),
    ("unknown content key", native_with(contents=[{**user(TEXT), "name": "x"}]), "native-image-2"),
    ("parts missing", native_with(contents=[{"role": "user"}]), "native-image-2"),
    ("parts empty", native_with(contents=[user()]), "native-image-2"),
    ("role system", native_with(contents=[user(TEXT, role="system")]), "native-image-2"),
    ("part with neither", native_with(contents=[user({})]), "native-image-2"),
    ("part with only extras", native_with(contents=[user({"thought": False})]), "native-image-2"),
    ("part with both", native_with(contents=[user({**TEXT, **image_part()})]), "native-image-2"),
    ("text not a string", native_with(contents=[user({"text": 5})]), "native-image-2"),
    ("fileData", native_with(contents=[user(TEXT, {"fileData": {"fileUri": "gs://x"}})]), "native-image-2"),
    ("functionCall", native_with(contents=[user(TEXT, {"functionCall": {"name": "f"}})]), "native-image-2"),
    ("mimeType webp", native_with(contents=[user(TEXT, image_part(mime="image/webp"))]), "native-image-2"),
    (
        "mimeType missing",
        native_with(contents=[user(TEXT, {"inlineData": {"data": b64(PNG)}})]),
        "native-image-2",
    ),
    (
        "data missing",
        native_with(contents=[user(TEXT, {"inlineData": {"mimeType": "image/png"}})]),
        "native-image-2",
    ),
    (
        "data-URL prefix",
        native_with(
            contents=[
                user(
                    TEXT,
                    {"inlineData": {"mimeType": "image/png", "data": "data:image/png;base64," + b64(PNG)}},
                )
            ]
        ),
        "native-image-2",
    ),
    (
        "bad base64",
        native_with(contents=[user(TEXT, {"inlineData": {"mimeType": "image/png", "data": "not base64!!"}})]),
        "native-image-2",
    ),
    (
        "image URL",
        native_with(
            contents=[
                user(TEXT, {"inlineData": {"mimeType": "image/png", "data": "https://example.com/a.png"}})
            ]
        ),
        "native-image-2",
    ),
    (
        "JPEG bytes declared PNG",
        native_with(contents=[user(TEXT, image_part(JPEG, "image/png"))]),
        "native-image-2",
    ),
    (
        "PNG bytes declared JPEG",
        native_with(contents=[user(TEXT, image_part(PNG, "image/jpeg"))]),
        "native-image-2",
    ),
    (
        "not an image",
        native_with(contents=[user(TEXT, image_part(b"GIF89a....", "image/png"))]),
        "native-image-2",
    ),
    (
        "damaged PNG",
        native_with(contents=[user(TEXT, image_part(PNG[:40] + b"\x00" * 40, "image/png"))]),
        "native-image-2",
    ),
    (
        "inlineData extra key",
        native_with(
            contents=[
                user(
                    TEXT,
                    image_part(PNG)
                    | {"inlineData": {"mimeType": "image/png", "data": b64(PNG), "fileUri": "x"}},
                )
            ]
        ),
        "native-image-2",
    ),
    (
        "responseModalities TEXT",
        native_with(generationConfig={"responseModalities": ["TEXT"]}),
        "native-image-2",
    ),
    (
        "responseModalities both",
        native_with(generationConfig={"responseModalities": ["TEXT", "IMAGE"]}),
        "native-image-2",
    ),
    (
        "responseModalities lowercase",
        native_with(generationConfig={"responseModalities": ["image"]}),
        "native-image-2",
    ),
    ("responseModalities empty", native_with(generationConfig={"responseModalities": []}), "native-image-2"),
    (
        "responseModalities string",
        native_with(generationConfig={"responseModalities": "IMAGE"}),
        "native-image-2",
    ),
    ("candidateCount 2", native_with(generationConfig=config(candidateCount=2)), "native-image-2"),
    ("candidateCount 0", native_with(generationConfig=config(candidateCount=0)), "native-image-2"),
    ("candidateCount string", native_with(generationConfig=config(candidateCount="1")), "native-image-2"),
    ("candidateCount float", native_with(generationConfig=config(candidateCount=1.0)), "native-image-2"),
    ("candidateCount bool", native_with(generationConfig=config(candidateCount=True)), "native-image-2"),
    (
        "responseMimeType",
        native_with(generationConfig=config(responseMimeType="image/png")),
        "native-image-2",
    ),
    ("responseSchema", native_with(generationConfig=config(responseSchema={})), "native-image-2"),
    ("temperature", native_with(generationConfig=config(temperature=0.5)), "native-image-2"),
    ("audio settings", native_with(generationConfig=config(speechConfig={})), "native-image-2"),
    (
        "unknown imageConfig key",
        native_with(generationConfig=config(imageConfig={"outputMimeType": "image/jpeg"})),
        "native-image-2",
    ),
    (
        "compression format",
        native_with(generationConfig=config(imageConfig={"compressionQuality": 80})),
        "native-image-2",
    ),
    ("imageSize 1k", native_body(size="1k"), "native-image-2"),
    ("imageSize 4k", native_body(size="4k"), "native-image-2"),
    ("imageSize 8K", native_body(size="8K"), "native-image-2"),
    (
        "imageSize 1024",
        native_with(generationConfig=config(imageConfig={"imageSize": 1024})),
        "native-image-2",
    ),
    ("ratio 2:1", native_body(ratio="2:1"), "native-image-2"),
    ("ratio 16x9", native_body(ratio="16x9"), "native-image-2"),
    ("ratio 1:4 on pro", native_body(ratio="1:4"), "native-image-pro"),
    ("ratio 8:1 on pro", native_body(ratio="8:1"), "native-image-pro"),
    (
        "last turn is a model turn",
        native_with(contents=[user(TEXT), user(TEXT, role="model")]),
        "native-image-2",
    ),
    (
        "signature in a user turn",
        native_with(contents=[user({**TEXT, "thoughtSignature": "AQ=="})]),
        "native-image-2",
    ),
]


@pytest.mark.parametrize(("body", "model"), [pytest.param(b, m, id=i) for i, b, m in NATIVE_400])
def test_native_body_rules(emulator: EmulatorServer, body: Any, model: str) -> None:
    assert_error(post(emulator, Route.NATIVE, body, model=model), 400, "invalid_request")
    assert emulator.ledger() == []


NATIVE_OK: list[tuple[str, Any, str]] = [
    ("minimal", {"contents": [{"parts": [TEXT]}]}, "native-image-2"),
    ("candidateCount 1", native_with(generationConfig=config(candidateCount=1)), "native-image-2"),
    ("empty generationConfig", native_with(generationConfig={}), "native-image-2"),
    ("2K", native_body(size="2K"), "native-image-2"),
    ("21:9 on pro", native_body(ratio="21:9"), "native-image-pro"),
    ("1:8 on 2.1", native_body(ratio="1:8"), "native-image-2.1"),
    (
        "reference images",
        native_with(contents=[user(TEXT, image_part(PNG), image_part(JPEG, "image/jpeg"))]),
        "native-image-2",
    ),
    ("extra part property", native_with(contents=[user({**TEXT, "mediaResolution": "x"})]), "native-image-2"),
]


@pytest.mark.parametrize(("body", "model"), [pytest.param(b, m, id=i) for i, b, m in NATIVE_OK])
def test_native_valid_bodies_pass(emulator: EmulatorServer, body: Any, model: str) -> None:
    response = post(emulator, Route.NATIVE, body, model=model)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[]", b'"x"', b"null", b'{"contents": NaN}'])
@pytest.mark.parametrize("route", [r for r in Route if r is not Route.IMAGES_EDITS])
def test_invalid_json_is_400(emulator: EmulatorServer, route: Route, raw: bytes) -> None:
    headers = {**auth_headers(emulator, route), "Content-Type": "application/json"}
    assert_error(http().post(emulator.url + path_of(route), headers=headers, content=raw), 400)


@pytest.mark.parametrize("route", [r for r in Route if r is not Route.IMAGES_EDITS])
def test_json_routes_want_json_content_type(emulator: EmulatorServer, route: Route) -> None:
    headers = {**auth_headers(emulator, route), "Content-Type": "text/plain"}
    response = http().post(emulator.url + path_of(route), headers=headers, content=b"{}")
    assert "application/json" in assert_error(response, 400)["error"]["message"]


def test_native_streaming_query_is_400(emulator: EmulatorServer) -> None:
    headers = auth_headers(emulator, Route.NATIVE)
    url = emulator.url + path_of(Route.NATIVE) + "?alt=sse"
    assert_error(http().post(url, headers=headers, json=native_body()), 400)


@pytest.mark.parametrize("value", ["0", "5", "-1", "1.5", "two", "", "+2", "10"])
@pytest.mark.parametrize("route", [Route.NATIVE, Route.CHAT])
def test_max_images_header_outside_1_to_4_is_400(emulator: EmulatorServer, route: Route, value: str) -> None:
    response = post(emulator, route, headers={"X-Service-Max-Images": value})
    assert "X-Service-Max-Images" in assert_error(response, 400, "invalid_request")["error"]["message"]


def test_repeated_max_images_header_is_400(emulator: EmulatorServer) -> None:
    headers = [
        *auth_headers(emulator, Route.NATIVE).items(),
        ("X-Service-Max-Images", "1"),
        ("X-Service-Max-Images", "2"),
    ]
    response = http().post(emulator.url + path_of(Route.NATIVE), headers=headers, json=native_body())
    assert_error(response, 400)


# --- chat, images, messages, responses bodies ----------------------------------------------------

CHAT = VALID_BODIES[Route.CHAT]
IMAGES = VALID_BODIES[Route.IMAGES_GENERATIONS]
MESSAGES = VALID_BODIES[Route.MESSAGES]
RESPONSES = VALID_BODIES[Route.RESPONSES]


def without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


# (id, route, body, status, code)
BODY_ERRORS: list[tuple[str, Route, Any, int, str]] = [
    ("chat model missing", Route.CHAT, without(CHAT, "model"), 400, "invalid_request"),
    ("chat images model", Route.CHAT, {**CHAT, "model": "compat-image-2"}, 400, "invalid_request"),
    ("chat unknown model", Route.CHAT, {**CHAT, "model": "native-image-9"}, 404, "model_not_found"),
    ("chat messages missing", Route.CHAT, without(CHAT, "messages"), 400, "invalid_request"),
    ("chat messages empty", Route.CHAT, {**CHAT, "messages": []}, 400, "invalid_request"),
    (
        "chat content not a string",
        Route.CHAT,
        {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]},
        400,
        "invalid_request",
    ),
    ("chat role missing", Route.CHAT, {**CHAT, "messages": [{"content": "x"}]}, 400, "invalid_request"),
    (
        "chat no user message",
        Route.CHAT,
        {**CHAT, "messages": [{"role": "system", "content": "x"}]},
        400,
        "invalid_request",
    ),
    ("chat n 2", Route.CHAT, {**CHAT, "n": 2}, 400, "invalid_request"),
    ("chat stream", Route.CHAT, {**CHAT, "stream": True}, 400, "invalid_request"),
    ("chat generationConfig", Route.CHAT, {**CHAT, "generationConfig": {}}, 400, "invalid_request"),
    (
        "chat size 1k",
        Route.CHAT,
        {**CHAT, "native": {"image_config": {"image_size": "1k"}}},
        400,
        "invalid_request",
    ),
    (
        "chat ratio 1:4 on pro",
        Route.CHAT,
        {**CHAT, "model": "native-image-pro", "native": {"image_config": {"aspect_ratio": "1:4"}}},
        400,
        "invalid_request",
    ),
    (
        "chat unknown image_config key",
        Route.CHAT,
        {**CHAT, "native": {"image_config": {"imageSize": "1K"}}},
        400,
        "invalid_request",
    ),
    (
        "chat unknown native key",
        Route.CHAT,
        {**CHAT, "native": {"generationConfig": {}}},
        400,
        "invalid_request",
    ),
    ("images prompt missing", Route.IMAGES_GENERATIONS, without(IMAGES, "prompt"), 400, "invalid_request"),
    ("images prompt empty", Route.IMAGES_GENERATIONS, {**IMAGES, "prompt": ""}, 400, "invalid_request"),
    ("images n 2", Route.IMAGES_GENERATIONS, {**IMAGES, "n": 2}, 400, "invalid_request"),
    ("images size 512", Route.IMAGES_GENERATIONS, {**IMAGES, "size": "512x512"}, 400, "invalid_request"),
    (
        "images size uppercase X",
        Route.IMAGES_GENERATIONS,
        {**IMAGES, "size": "1024X1024"},
        400,
        "invalid_request",
    ),
    (
        "images response_format url",
        Route.IMAGES_GENERATIONS,
        {**IMAGES, "response_format": "url"},
        400,
        "invalid_request",
    ),
    (
        "images output_format jpeg",
        Route.IMAGES_GENERATIONS,
        {**IMAGES, "output_format": "jpeg"},
        400,
        "invalid_request",
    ),
    (
        "images output_format webp",
        Route.IMAGES_GENERATIONS,
        {**IMAGES, "output_format": "webp"},
        400,
        "invalid_request",
    ),
    ("images unknown field", Route.IMAGES_GENERATIONS, {**IMAGES, "style": "vivid"}, 400, "invalid_request"),
    (
        "images unknown model",
        Route.IMAGES_GENERATIONS,
        {**IMAGES, "model": "compat-image-3"},
        404,
        "model_not_found",
    ),
    *[
        (f"images {m}", Route.IMAGES_GENERATIONS, {**IMAGES, "model": m}, 400, "unsupported_endpoint")
        for m in NATIVE_MODELS
    ],
    ("messages model missing", Route.MESSAGES, without(MESSAGES, "model"), 400, "invalid_request"),
    ("messages model empty", Route.MESSAGES, {**MESSAGES, "model": ""}, 400, "invalid_request"),
    ("messages image model", Route.MESSAGES, {**MESSAGES, "model": "native-image-2"}, 404, "model_not_found"),
    ("messages max_tokens 0", Route.MESSAGES, {**MESSAGES, "max_tokens": 0}, 400, "invalid_request"),
    ("messages max_tokens string", Route.MESSAGES, {**MESSAGES, "max_tokens": "64"}, 400, "invalid_request"),
    ("messages messages missing", Route.MESSAGES, without(MESSAGES, "messages"), 400, "invalid_request"),
    ("messages messages empty", Route.MESSAGES, {**MESSAGES, "messages": []}, 400, "invalid_request"),
    (
        "messages role system",
        Route.MESSAGES,
        {**MESSAGES, "messages": [{"role": "system", "content": "x"}]},
        400,
        "invalid_request",
    ),
    (
        "messages content missing",
        Route.MESSAGES,
        {**MESSAGES, "messages": [{"role": "user"}]},
        400,
        "invalid_request",
    ),
    ("messages stream", Route.MESSAGES, {**MESSAGES, "stream": True}, 400, "invalid_request"),
    ("responses model missing", Route.RESPONSES, without(RESPONSES, "model"), 400, "invalid_request"),
    ("responses input missing", Route.RESPONSES, without(RESPONSES, "input"), 400, "invalid_request"),
    ("responses input empty", Route.RESPONSES, {**RESPONSES, "input": ""}, 400, "invalid_request"),
    (
        "responses input list",
        Route.RESPONSES,
        {**RESPONSES, "input": [{"role": "user", "content": "x"}]},
        400,
        "invalid_request",
    ),
    (
        "responses image model",
        Route.RESPONSES,
        {**RESPONSES, "model": "compat-image-2"},
        404,
        "model_not_found",
    ),
    ("responses stream", Route.RESPONSES, {**RESPONSES, "stream": True}, 400, "invalid_request"),
]


@pytest.mark.parametrize(
    ("route", "body", "status", "code"), [pytest.param(r, b, s, c, id=i) for i, r, b, s, c in BODY_ERRORS]
)
def test_body_rules(emulator: EmulatorServer, route: Route, body: Any, status: int, code: str) -> None:
    assert_error(post(emulator, route, body), status, code)
    assert emulator.ledger() == []


def test_messages_max_tokens_defaults(emulator: EmulatorServer) -> None:
    assert post(emulator, Route.MESSAGES, without(MESSAGES, "max_tokens")).status_code == 200
