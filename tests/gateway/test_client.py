"""GatewayClient against `httpx.MockTransport`: request shapes, auth, headers, timeouts, retries, readers.

No network and no real waiting: the fake service below records every request it receives and plays back
scripted replies, and the client's `sleep` only records the delay it was asked to wait.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from PIL import Image

from imagebatch.gateway import (
    AttemptFinished,
    AttemptStarted,
    GatewayClient,
    ImageResult,
    ImageUpload,
    NoImageResult,
    TextResult,
)
from imagebatch.gateway.constants import Route
from imagebatch.gateway.errors import (
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    GatewayError,
    InsufficientFundsError,
    NotFoundError,
    OutcomeUnknownError,
    RateLimitError,
    RequestValidationError,
    ResponseFormatError,
    ServerError,
    ServiceUnreachableError,
    UnsupportedEndpointError,
)
from imagebatch.gateway.models import NativeRequest

KEY = "sk-svc-0123456789abcdef-SECRET"
BASE = "http://gateway.test"
IDEM = "job-7:0:3f2a9c"


# --- images, bodies and replies ------------------------------------------------------------------------


def make_image(fmt: str, size: tuple[int, int] = (8, 8), mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, (200, 30, 30) if mode == "RGB" else (200, 30, 30, 0)).save(buf, format=fmt)
    return buf.getvalue()


PNG = make_image("PNG")
PNG_WIDE = make_image("PNG", (8, 4))
JPEG = make_image("JPEG", (6, 8))
MASK = make_image("PNG", mode="RGBA")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def text_part(text: str, **extra: Any) -> dict[str, Any]:
    return {"text": text, **extra}


def image_part(data: bytes, mime: str = "image/png", **extra: Any) -> dict[str, Any]:
    return {"inlineData": {"mimeType": mime, "data": b64(data)}, **extra}


USAGE_METADATA = {"promptTokenCount": 7, "candidatesTokenCount": 1290, "details": [{"modality": "IMAGE"}]}


def native_body(*parts: dict[str, Any], finish: str = "STOP", **top: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "candidates": [{"content": {"role": "model", "parts": list(parts)}, "finishReason": finish}],
        "usageMetadata": USAGE_METADATA,
    }
    body.update(top)
    return body


def chat_body(content: str | None, **top: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        **top,
    }


def images_body(data: bytes = PNG, **item_extra: Any) -> dict[str, Any]:
    return {"created": 1_700_000_000, "data": [{"b64_json": b64(data), **item_extra}]}


@dataclass
class Reply:
    """One scripted answer of the fake service: a response, or a transport error raised instead."""

    status: int = 200
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    error: type[httpx.TransportError] | None = None

    def build(self, request: httpx.Request) -> httpx.Response:
        if self.error is not None:
            raise self.error("simulated", request=request)
        if self.content is not None:
            return httpx.Response(self.status, content=self.content, headers=self.headers)
        return httpx.Response(self.status, json=self.json, headers=self.headers)


class FakeService:
    """A MockTransport handler that records requests and plays replies (the last one repeats).

    `log` is one timeline shared by the handler, the observer and the sleep function, so a test can
    assert the order of "reported", "sent" and "waited".
    """

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.log: list[Any] = []
        self.delays: list[float] = []
        self._replies: list[Reply] = []
        self._clients: list[GatewayClient] = []

    def reply(self, *replies: Reply) -> FakeService:
        self._replies.extend(replies)
        return self

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.log.append(("sent", len(self.requests)))
        assert self._replies, "the client sent a request the test did not expect"
        reply = self._replies.pop(0) if len(self._replies) > 1 else self._replies[0]
        return reply.build(request)

    def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        self.log.append(("sleep", delay))

    def observe(self, event: AttemptStarted | AttemptFinished) -> None:
        self.log.append(event)

    def client(self, base_url: str = BASE, api_key: str = KEY, **options: Any) -> GatewayClient:
        client = GatewayClient(
            base_url, api_key, sleep=self.sleep, transport=httpx.MockTransport(self.handle), **options
        )
        self._clients.append(client)
        return client

    @property
    def request(self) -> httpx.Request:
        assert len(self.requests) == 1, f"expected one request, got {len(self.requests)}"
        return self.requests[0]

    def events(self) -> list[AttemptStarted | AttemptFinished]:
        return [e for e in self.log if isinstance(e, AttemptStarted | AttemptFinished)]

    def close(self) -> None:
        for client in self._clients:
            client.close()


@pytest.fixture
def service() -> Iterator[FakeService]:
    fake = FakeService()
    yield fake
    fake.close()


def sent_json(request: httpx.Request) -> Any:
    assert request.headers["content-type"] == "application/json"
    return json.loads(request.content)


@dataclass(frozen=True)
class FormPart:
    name: str
    filename: str | None
    content_type: str | None
    value: bytes


def parse_multipart(request: httpx.Request) -> list[FormPart]:
    """Split a multipart/form-data body exactly, byte for byte (binary file data included)."""
    ctype = request.headers["content-type"]
    assert ctype.startswith("multipart/form-data; boundary="), ctype
    boundary = ctype.split("boundary=", 1)[1].encode()
    body = request.content
    assert body.endswith(b"--" + boundary + b"--\r\n")
    parts = []
    for chunk in body.split(b"--" + boundary)[1:-1]:
        assert chunk.startswith(b"\r\n") and chunk.endswith(b"\r\n")
        head, _, value = chunk[2:-2].partition(b"\r\n\r\n")
        headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n"))
        disposition = headers["Content-Disposition"]
        name = re.search(r'; name="([^"]*)"', disposition)
        filename = re.search(r'; filename="([^"]*)"', disposition)
        assert name is not None
        parts.append(
            FormPart(
                name.group(1),
                filename.group(1) if filename else None,
                headers.get("Content-Type"),
                value,
            )
        )
    return parts


# --- the six routes, each with a valid request and a valid answer ---------------------------------------

NATIVE_REQUEST = {
    "contents": [{"parts": [{"text": "a red square"}]}],
    "generationConfig": {
        "responseModalities": ["IMAGE"],
        "candidateCount": 1,
        "imageConfig": {"imageSize": "2K", "aspectRatio": "16:9"},
    },
}
CHAT_REQUEST = {
    "model": "native-image-2",
    "messages": [{"role": "user", "content": "a red square"}],
    "native": {"image_config": {"image_size": "2K", "aspect_ratio": "4:1"}},
}
IMAGES_REQUEST = {"prompt": "a red square", "size": "1536x1024"}
MESSAGES_REQUEST = {
    "model": "text-model-a",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hi"}],
}
RESPONSES_REQUEST = {"model": "text-model-b", "input": "hi"}


@dataclass(frozen=True)
class RouteCase:
    route: Route
    call: Callable[..., Any]
    ok: Reply

    def __call__(self, client: GatewayClient, **kw: Any) -> Any:
        kw.setdefault("idempotency_key", IDEM)
        return self.call(client, **kw)


ROUTES: dict[str, RouteCase] = {
    "native": RouteCase(
        Route.NATIVE,
        lambda c, **kw: c.generate_content("native-image-2", NATIVE_REQUEST, **kw),
        Reply(json=native_body(image_part(PNG))),
    ),
    "chat": RouteCase(
        Route.CHAT,
        lambda c, **kw: c.chat_completions(CHAT_REQUEST, **kw),
        Reply(json=chat_body(f"![image](data:image/png;base64,{b64(PNG)})")),
    ),
    "images_generations": RouteCase(
        Route.IMAGES_GENERATIONS,
        lambda c, **kw: c.images_generate(IMAGES_REQUEST, **kw),
        Reply(json=images_body()),
    ),
    "images_edits": RouteCase(
        Route.IMAGES_EDITS,
        lambda c, **kw: c.images_edit(IMAGES_REQUEST, [ImageUpload(PNG)], **kw),
        Reply(json=images_body()),
    ),
    "messages": RouteCase(
        Route.MESSAGES,
        lambda c, **kw: c.messages(MESSAGES_REQUEST, **kw),
        Reply(json={"content": [{"type": "text", "text": "hello"}], "usage": {"input_tokens": 1}}),
    ),
    "responses": RouteCase(
        Route.RESPONSES,
        lambda c, **kw: c.responses(RESPONSES_REQUEST, **kw),
        Reply(json={"output_text": "hello", "usage": {"total_tokens": 3}}),
    ),
}
ALL_ROUTES = list(ROUTES)
RETRYING_ROUTES = ["images_generations", "images_edits", "messages", "responses"]
SINGLE_ATTEMPT_ROUTES = ["native", "chat"]
RETRYABLE_STATUSES = [408, 409, 425, 429, 500, 502, 503, 504]
NEVER_RETRIED = {
    400: BadRequestError,
    401: AuthenticationError,
    402: InsufficientFundsError,
    404: NotFoundError,
}
EXPECTED_PATHS = {
    "native": "/v1beta/models/native-image-2:generateContent",
    "chat": "/v1/chat/completions",
    "images_generations": "/v1/images/generations",
    "images_edits": "/v1/images/edits",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}


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
    service.reply(Reply(503), Reply(error=httpx.ReadTimeout), Reply(429), ROUTES[name].ok)
    result = ROUTES[name](service.client(), idempotency_key="row-42:1:abc")
    assert result.attempts == 4
    assert [r.headers["Idempotency-Key"] for r in service.requests] == ["row-42:1:abc"] * 4


@pytest.mark.parametrize("name", ALL_ROUTES)
def test_missing_idempotency_key_is_refused(service: FakeService, name: str) -> None:
    with pytest.raises(RequestValidationError, match="idempotency"):
        ROUTES[name](service.reply(ROUTES[name].ok).client(), idempotency_key="")
    assert service.requests == []


# === base URL and configuration ==========================================================================


@pytest.mark.parametrize(
    ("base_url", "suffix", "fix"),
    [
        ("http://gw.test/v1", "/v1", "http://gw.test"),
        ("http://gw.test/v1/", "/v1", "http://gw.test"),
        ("http://gw.test/v1beta", "/v1beta", "http://gw.test"),
        ("https://gw.test/api/v1beta/", "/v1beta", "https://gw.test/api"),
    ],
)
def test_base_url_with_version_suffix_is_refused_naming_the_fix(base_url: str, suffix: str, fix: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        GatewayClient(base_url, KEY)
    assert f"without {suffix}" in str(info.value)
    assert repr(fix) in str(info.value)


@pytest.mark.parametrize("base_url", ["ftp://gw.test", "gw.test", "localhost:8000", "", "  ", "http://[::1"])
def test_base_url_must_be_http(base_url: str) -> None:
    with pytest.raises(ConfigurationError, match="http"):
        GatewayClient(base_url, KEY)


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("http://gateway.test/", "http://gateway.test/v1/responses"),
        ("http://gateway.test", "http://gateway.test/v1/responses"),
        ("https://gateway.test/relay/", "https://gateway.test/relay/v1/responses"),
    ],
)
def test_base_url_trailing_slash_and_prefix_are_kept_right(
    service: FakeService, base_url: str, expected: str
) -> None:
    ROUTES["responses"](service.reply(ROUTES["responses"].ok).client(base_url=base_url))
    assert str(service.request.url) == expected


def test_api_key_is_required() -> None:
    with pytest.raises(ConfigurationError, match="API key"):
        GatewayClient(BASE, "")


def test_client_repr_hides_the_key(service: FakeService) -> None:
    assert KEY not in repr(service.client())


# === timeouts ============================================================================================

DEFAULT_READ_TIMEOUT = {
    "native": 650,
    "chat": 650,
    "images_generations": 650,
    "images_edits": 650,
    "messages": 3000,
    "responses": 3000,
}


@pytest.mark.parametrize("name", ALL_ROUTES)
def test_default_timeouts(service: FakeService, name: str) -> None:
    ROUTES[name](service.reply(ROUTES[name].ok).client())
    timeout = service.request.extensions["timeout"]
    expected = DEFAULT_READ_TIMEOUT[name]
    assert timeout["read"] == timeout["write"] == timeout["pool"] == expected
    assert 0 < timeout["connect"] <= expected


@pytest.mark.parametrize("name", ALL_ROUTES)
def test_timeouts_are_configurable(service: FakeService, name: str) -> None:
    client = service.reply(ROUTES[name].ok).client(image_timeout=12.5, text_timeout=99.0)
    ROUTES[name](client)
    expected = 99.0 if ROUTES[name].route in (Route.MESSAGES, Route.RESPONSES) else 12.5
    assert service.request.extensions["timeout"]["read"] == expected


# === retries =============================================================================================


@pytest.mark.parametrize("name", RETRYING_ROUTES)
@pytest.mark.parametrize("status", RETRYABLE_STATUSES)
def test_retrying_routes_retry_status_on_the_spec_schedule(
    service: FakeService, name: str, status: int
) -> None:
    with pytest.raises(APIStatusError) as info:
        ROUTES[name](service.reply(Reply(status, json={"error": {"message": "busy"}})).client())
    assert len(service.requests) == 4
    assert service.delays == [3, 8, 15]
    assert info.value.status_code == status
    assert info.value.attempts == 4


@pytest.mark.parametrize("name", RETRYING_ROUTES)
@pytest.mark.parametrize("status", RETRYABLE_STATUSES)
def test_retrying_routes_recover_after_a_retryable_status(
    service: FakeService, name: str, status: int
) -> None:
    result = ROUTES[name](service.reply(Reply(status), Reply(status), ROUTES[name].ok).client())
    assert result.attempts == 3
    assert service.delays == [3, 8]


@pytest.mark.parametrize("name", RETRYING_ROUTES)
@pytest.mark.parametrize("status", list(NEVER_RETRIED))
def test_retrying_routes_never_retry_client_errors(service: FakeService, name: str, status: int) -> None:
    with pytest.raises(NEVER_RETRIED[status]) as info:
        ROUTES[name](
            service.reply(Reply(status, json={"error": {"message": "no"}}), ROUTES[name].ok).client()
        )
    assert len(service.requests) == 1
    assert service.delays == []
    assert info.value.attempts == 1


@pytest.mark.parametrize("name", RETRYING_ROUTES)
@pytest.mark.parametrize("error", [httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError])
def test_retrying_routes_retry_transport_errors(
    service: FakeService, name: str, error: type[httpx.TransportError]
) -> None:
    with pytest.raises(OutcomeUnknownError) as info:
        ROUTES[name](service.reply(Reply(error=error)).client())
    assert len(service.requests) == 4
    assert service.delays == [3, 8, 15]
    assert info.value.attempts == 4


@pytest.mark.parametrize("name", RETRYING_ROUTES)
def test_retrying_routes_retry_connection_failures(service: FakeService, name: str) -> None:
    with pytest.raises(ServiceUnreachableError):
        ROUTES[name](service.reply(Reply(error=httpx.ConnectError)).client())
    assert len(service.requests) == 4
    assert service.delays == [3, 8, 15]


@pytest.mark.parametrize("name", RETRYING_ROUTES)
def test_retrying_routes_recover_after_a_transport_error(service: FakeService, name: str) -> None:
    result = ROUTES[name](service.reply(Reply(error=httpx.RemoteProtocolError), ROUTES[name].ok).client())
    assert result.attempts == 2
    assert service.delays == [3]


@pytest.mark.parametrize("name", SINGLE_ATTEMPT_ROUTES)
@pytest.mark.parametrize("status", [*RETRYABLE_STATUSES, *NEVER_RETRIED])
def test_native_and_chat_make_one_attempt_on_any_status(service: FakeService, name: str, status: int) -> None:
    with pytest.raises(APIStatusError) as info:
        ROUTES[name](service.reply(Reply(status), ROUTES[name].ok).client())
    assert len(service.requests) == 1
    assert service.delays == []
    assert info.value.status_code == status
    assert info.value.attempts == 1


@pytest.mark.parametrize("name", SINGLE_ATTEMPT_ROUTES)
@pytest.mark.parametrize("error", [httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.WriteTimeout])
def test_native_and_chat_no_answer_is_outcome_unknown(
    service: FakeService, name: str, error: type[httpx.TransportError]
) -> None:
    with pytest.raises(OutcomeUnknownError, match="billed") as info:
        ROUTES[name](service.reply(Reply(error=error), ROUTES[name].ok).client())
    assert len(service.requests) == 1
    assert service.delays == []
    assert info.value.attempts == 1


@pytest.mark.parametrize("name", SINGLE_ATTEMPT_ROUTES)
@pytest.mark.parametrize("error", [httpx.ConnectError, httpx.ConnectTimeout])
def test_native_and_chat_connection_failure_is_unreachable(
    service: FakeService, name: str, error: type[httpx.TransportError]
) -> None:
    with pytest.raises(ServiceUnreachableError):
        ROUTES[name](service.reply(Reply(error=error), ROUTES[name].ok).client())
    assert len(service.requests) == 1
    assert service.delays == []


@pytest.mark.parametrize("name", RETRYING_ROUTES)
def test_malformed_success_is_not_retried(service: FakeService, name: str) -> None:
    with pytest.raises(ResponseFormatError):
        ROUTES[name](service.reply(Reply(content=b"<html>ok</html>"), ROUTES[name].ok).client())
    assert len(service.requests) == 1


# === the attempt observer ================================================================================


def test_observer_reports_before_sending_and_after_each_answer(service: FakeService) -> None:
    usage = {"prompt_tokens": 5}
    service.reply(
        Reply(503, json={"error": {"message": "overloaded"}}, headers={"x-request-id": "req-1"}),
        Reply(error=httpx.ReadTimeout),
        Reply(json={**images_body(), "usage": usage}, headers={"x-request-id": "req-3"}),
    )
    client = service.client()
    client.images_generate(IMAGES_REQUEST, idempotency_key=IDEM, observer=service.observe)

    kinds = [
        type(e).__name__ if isinstance(e, AttemptStarted | AttemptFinished) else e[0] for e in service.log
    ]
    assert kinds == [
        "AttemptStarted", "sent", "AttemptFinished", "sleep",
        "AttemptStarted", "sent", "AttemptFinished", "sleep",
        "AttemptStarted", "sent", "AttemptFinished",
    ]  # fmt: skip
    started = [e for e in service.events() if isinstance(e, AttemptStarted)]
    finished = [e for e in service.events() if isinstance(e, AttemptFinished)]
    assert [e.attempt for e in started] == [1, 2, 3]
    assert {(e.route, e.model, e.idempotency_key) for e in service.events()} == {
        (Route.IMAGES_GENERATIONS, "compat-image-2", IDEM)
    }
    assert [(f.attempt, f.status, f.outcome, f.request_id, f.retry_in) for f in finished] == [
        (1, 503, "error", "req-1", 3),
        (2, None, "no_answer", None, 8),
        (3, 200, "ok", "req-3", None),
    ]
    assert finished[0].error_message == "overloaded"
    assert finished[2].images == 1
    assert finished[2].usage == usage
    assert all(f.duration >= 0 for f in finished)
    assert [f.started_at for f in finished] == [s.started_at for s in started]


def test_observer_sees_native_images_count_and_usage(service: FakeService) -> None:
    answer = native_body(image_part(PNG), image_part(JPEG, "image/jpeg"))
    service.reply(Reply(json=answer, headers={"x-request-id": "n-1"}))
    ROUTES["native"](service.client(), observer=service.observe)
    start, end = service.events()
    assert isinstance(start, AttemptStarted) and isinstance(end, AttemptFinished)
    assert service.log.index(start) < service.log.index(("sent", 1)) < service.log.index(end)
    assert (end.attempt, end.status, end.outcome, end.images, end.request_id) == (1, 200, "ok", 2, "n-1")
    assert end.usage == USAGE_METADATA
    assert end.retry_in is None


def test_observer_reports_a_connection_failure_as_not_sent(service: FakeService) -> None:
    with pytest.raises(ServiceUnreachableError):
        ROUTES["native"](service.reply(Reply(error=httpx.ConnectError)).client(), observer=service.observe)
    _, end = service.events()
    assert isinstance(end, AttemptFinished)
    assert (end.status, end.outcome, end.retry_in) == (None, "not_sent", None)


def test_observer_reports_a_malformed_success_as_error(service: FakeService) -> None:
    with pytest.raises(ResponseFormatError) as info:
        ROUTES["native"](
            service.reply(Reply(json=[], headers={"x-request-id": "bad-1"})).client(),
            observer=service.observe,
        )
    _, end = service.events()
    assert isinstance(end, AttemptFinished)
    assert (end.status, end.outcome, end.request_id) == (200, "error", "bad-1")
    assert info.value.request_id == "bad-1"


# === error mapping =======================================================================================


@pytest.mark.parametrize(
    ("status", "body", "cls"),
    [
        (400, {"error": {"message": "bad size", "code": "invalid_request"}}, BadRequestError),
        (
            400,
            {"error": {"message": "use generateContent", "code": "unsupported_endpoint"}},
            UnsupportedEndpointError,
        ),
        (401, {"error": {"message": "invalid key"}}, AuthenticationError),
        (402, {"error": {"message": "no funds"}}, InsufficientFundsError),
        (404, {"error": {"message": "no such model"}}, NotFoundError),
        (429, {"error": {"message": "slow down"}}, RateLimitError),
        (500, {"error": {"message": "generation failed"}}, ServerError),
        (503, {"error": {"message": "unavailable"}}, ServerError),
    ],
)
def test_error_statuses_map_to_their_class(service: FakeService, status: int, body: Any, cls: type) -> None:
    service.reply(Reply(status, json=body, headers={"x-request-id": "e-1"}))
    with pytest.raises(APIStatusError) as info:
        ROUTES["native"](service.client())
    exc = info.value
    assert type(exc) is cls
    assert exc.status_code == status
    assert exc.message == body["error"]["message"]
    assert exc.code == body["error"].get("code")
    assert exc.request_id == "e-1"


def test_unsupported_endpoint_is_a_bad_request(service: FakeService) -> None:
    body = {
        "error": {"message": "native model", "type": "invalid_request_error", "code": "unsupported_endpoint"}
    }
    with pytest.raises(UnsupportedEndpointError) as info:
        ROUTES["images_generations"](service.reply(Reply(400, json=body)).client())
    assert isinstance(info.value, BadRequestError)
    assert info.value.error_type == "invalid_request_error"
    assert len(service.requests) == 1


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply(400, json={"error": {"message": "from error"}, "message": "from top"}), "from error"),
        (Reply(400, json={"error": {"code": "invalid_request"}, "message": "from top"}), "from top"),
        (Reply(400, json={"error": {"message": ""}, "message": "from top"}), "from top"),
        (Reply(400, json={"error": {"code": "invalid_request"}}), "Bad Request"),
        (Reply(402, json={}), "Payment Required"),
        (Reply(502, content=b"<html><body>Bad gateway</body></html>"), "Bad Gateway"),
        (Reply(401, content=b""), "Unauthorized"),
    ],
)
def test_error_message_precedence(service: FakeService, reply: Reply, message: str) -> None:
    with pytest.raises(APIStatusError) as info:
        ROUTES["native"](service.reply(reply).client())
    assert info.value.message == message
    assert message in str(info.value)


@pytest.mark.parametrize("name", ["native", "images_generations", "messages"])
@pytest.mark.parametrize(
    "reply",
    [
        Reply(401, json={"error": {"message": f"invalid API key {KEY}", "code": "invalid_request"}}),
        Reply(401, json={"message": f"key {KEY} is not ours"}),
        Reply(429, json={"error": {"message": f"rate limit for {KEY}", "code": f"limit_{KEY}", "type": KEY}}),
        Reply(503, json={"error": {"message": f"Bearer {KEY} overloaded"}}),
    ],
    ids=["error.message", "message", "code-and-type", "retried"],
)
def test_api_key_never_leaks_into_errors_or_logs(
    service: FakeService, caplog: pytest.LogCaptureFixture, name: str, reply: Reply
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(GatewayError) as info:
        ROUTES[name](service.reply(reply).client(), observer=service.observe)
    exc = info.value
    texts = [str(exc), repr(exc), exc.message, *map(str, exc.args), *map(repr, exc.args)]
    texts += [str(getattr(exc, attr, "")) for attr in ("code", "error_type")]
    texts += [r.getMessage() for r in caplog.records] + [caplog.text]
    texts += [repr(e) for e in service.events()]
    assert all(KEY not in t for t in texts)
    assert "[redacted]" in exc.message
    if name != "native" and reply.status in (429, 503):
        waits = [r for r in caplog.records if r.name == "imagebatch.gateway"]
        assert len(waits) == 3  # the retry waits were logged, without the key


# === readers: native =====================================================================================


def run_native(service: FakeService, answer: Any, **headers: str) -> Any:
    return ROUTES["native"](service.reply(Reply(json=answer, headers=headers)).client())


def test_native_thought_parts_are_skipped_even_with_images(service: FakeService) -> None:
    answer = native_body(
        text_part("thinking", thought=True),
        image_part(JPEG, "image/jpeg", thought=True),
        text_part("Here you go"),
        image_part(PNG, thoughtSignature="sig"),
    )
    result = run_native(service, answer)
    assert isinstance(result, ImageResult)
    assert [i.data for i in result.images] == [PNG]
    assert result.text == "Here you go"


def test_native_only_thought_images_is_no_image(service: FakeService) -> None:
    answer = native_body(image_part(PNG, thought=True), text_part("draft", thought=True))
    result = run_native(service, answer)
    assert isinstance(result, NoImageResult)
    assert result.text is None


def test_native_image_second_after_text(service: FakeService) -> None:
    result = run_native(service, native_body(text_part("A red square."), image_part(PNG)))
    assert isinstance(result, ImageResult)
    assert [(i.data, i.mime_type, i.width, i.height) for i in result.images] == [(PNG, "image/png", 8, 8)]
    assert result.text == "A red square."
    assert result.finish_reason == "STOP"


def test_native_two_images_in_order(service: FakeService) -> None:
    result = run_native(service, native_body(image_part(PNG_WIDE), text_part("and"), image_part(PNG)))
    assert [(i.data, i.width, i.height) for i in result.images] == [(PNG_WIDE, 8, 4), (PNG, 8, 8)]


def test_native_jpeg_declared_as_jpeg(service: FakeService) -> None:
    (image,) = run_native(service, native_body(image_part(JPEG, "image/jpeg"))).images
    assert (image.data, image.mime_type, image.width, image.height) == (JPEG, "image/jpeg", 6, 8)


def test_native_png_declared_as_jpeg_is_read_as_png(service: FakeService) -> None:
    (image,) = run_native(service, native_body(image_part(PNG, "image/jpeg"))).images
    assert image.mime_type == "image/png"


def test_native_200_without_image_is_a_distinct_result(service: FakeService) -> None:
    feedback = {"safetyRatings": [{"category": "X", "probability": "HIGH"}]}
    answer = native_body(text_part("I can't draw that."), finish="IMAGE_SAFETY", promptFeedback=feedback)
    result = run_native(service, answer, **{"x-request-id": "ni-1"})
    assert isinstance(result, NoImageResult)
    assert result.text == "I can't draw that."
    assert result.finish_reason == "IMAGE_SAFETY"
    assert result.prompt_feedback == feedback
    assert result.usage == USAGE_METADATA
    assert result.request_id == "ni-1"


def test_native_blocked_prompt_without_candidates(service: FakeService) -> None:
    result = run_native(service, {"promptFeedback": {"blockReason": "SAFETY"}})
    assert isinstance(result, NoImageResult)
    assert result.prompt_feedback == {"blockReason": "SAFETY"}
    assert result.finish_reason is None


def test_native_model_content_is_the_candidate_content_as_returned(service: FakeService) -> None:
    answer = native_body(
        text_part("plan", thought=True, thoughtSignature="AAA/+=="),
        image_part(PNG, thoughtSignature="BBB"),
        {"thoughtSignature": "CCC", "text": "done", "futureField": {"kept": True}, "nullable": None},
    )
    expected = copy.deepcopy(answer["candidates"][0]["content"])
    result = run_native(service, answer)
    assert result.model_content == expected
    # Not a re-serialisation: key order, nulls and unknown fields are as the service sent them.
    assert list(result.model_content["parts"][2]) == ["thoughtSignature", "text", "futureField", "nullable"]


def test_native_usage_is_passed_through_untouched(service: FakeService) -> None:
    usage = {"promptTokenCount": 3, "odd": {"nested": [1, None, "x"]}, "totalTokenCount": 1293}
    result = run_native(service, {**native_body(image_part(PNG)), "usageMetadata": usage})
    assert result.usage == usage


# === readers: chat, images, text =========================================================================


def run(service: FakeService, name: str, answer: Any) -> Any:
    return ROUTES[name](service.reply(Reply(json=answer)).client())


def test_chat_one_image_from_markdown_data_url(service: FakeService) -> None:
    content = f"Here it is:\n\n![image](data:image/png;base64,{b64(PNG)})\n"
    result = run(service, "chat", chat_body(content, usage={"total_tokens": 9}))
    assert isinstance(result, ImageResult)
    assert [(i.data, i.mime_type) for i in result.images] == [(PNG, "image/png")]
    assert result.text == "Here it is:"
    assert result.usage == {"total_tokens": 9}
    assert result.finish_reason == "stop"


def test_chat_two_images_and_jpeg(service: FakeService) -> None:
    content = f"![a](data:image/jpeg;base64,{b64(JPEG)}) and ![b](data:image/png;base64,{b64(PNG_WIDE)})"
    result = run(service, "chat", chat_body(content))
    assert [(i.data, i.mime_type, i.width) for i in result.images] == [
        (JPEG, "image/jpeg", 6),
        (PNG_WIDE, "image/png", 8),
    ]
    assert result.text == "and"


def test_chat_without_image_is_no_image_with_text(service: FakeService) -> None:
    result = run(service, "chat", chat_body("I cannot help with that."))
    assert isinstance(result, NoImageResult)
    assert result.text == "I cannot help with that."


def test_images_route_reads_b64_json_and_tolerates_extra_fields(service: FakeService) -> None:
    answer = images_body(PNG_WIDE, revised_prompt="a red square, flat", seed=7)
    answer["usage"] = {"images": 1}
    answer["background"] = "opaque"
    result = run(service, "images_generations", answer)
    assert isinstance(result, ImageResult)
    assert [(i.data, i.mime_type, i.width, i.height) for i in result.images] == [
        (PNG_WIDE, "image/png", 8, 4)
    ]
    assert result.usage == {"images": 1}


def test_images_edit_reads_b64_json(service: FakeService) -> None:
    result = run(service, "images_edits", images_body(PNG, revised_prompt="x"))
    assert [i.data for i in result.images] == [PNG]


def test_messages_text_and_usage(service: FakeService) -> None:
    answer = {
        "id": "msg_1",
        "content": [
            {"type": "text", "text": "Hel"},
            {"type": "tool_use", "id": "t", "input": {}},
            {"type": "text", "text": "lo"},
            {"type": "text", "text": None},
        ],
        "usage": {"input_tokens": 3, "output_tokens": 2, "cache": {"x": 1}},
    }
    result = run(service, "messages", answer)
    assert isinstance(result, TextResult)
    assert result.text == "Hello"
    assert result.usage == answer["usage"]
    assert result.raw == answer


@pytest.mark.parametrize(
    "answer",
    [
        {"output_text": "Hello", "usage": {"total_tokens": 4}},
        {
            "output": [
                {"type": "reasoning", "summary": []},
                {"type": "message", "content": [{"type": "output_text", "text": "Hel"}, {"text": "lo"}]},
            ],
            "usage": {"total_tokens": 4},
        },
    ],
    ids=["output_text", "output"],
)
def test_responses_text_and_usage(service: FakeService, answer: dict[str, Any]) -> None:
    result = run(service, "responses", answer)
    assert result.text == "Hello"
    assert result.usage == {"total_tokens": 4}


# === malformed success bodies ============================================================================

MALFORMED = [
    ("native", Reply(content=b"not json")),
    ("native", Reply(json=[1, 2])),
    ("native", Reply(json={"candidates": {"content": {}}})),
    ("native", Reply(json=native_body({"inlineData": {"mimeType": "image/png", "data": "%%%not base64"}}))),
    ("native", Reply(json=native_body(image_part(b"GIF89a not an image")))),
    ("native", Reply(json=native_body({"inlineData": {"mimeType": "image/png"}}))),
    ("native", Reply(json=native_body(image_part(PNG[:20])))),
    ("chat", Reply(json={"choices": []})),
    ("chat", Reply(json={"id": "x"})),
    ("chat", Reply(json=chat_body(f"![x](data:image/png;base64,{b64(b'hello world')})"))),
    ("images_generations", Reply(json={"created": 1, "data": []})),
    ("images_generations", Reply(json={"created": 1, "data": [{"url": "https://cdn.test/a.png"}]})),
    ("images_generations", Reply(json=images_body(b"\x00\x01 not an image"))),
    ("images_edits", Reply(content=b"")),
    ("messages", Reply(json=["content"])),
    ("messages", Reply(content=b"{truncated")),
    ("responses", Reply(json={"output": 3})),
    ("responses", Reply(json="hello")),
]


@pytest.mark.parametrize(("name", "reply"), MALFORMED)
def test_malformed_success_body_is_a_format_error(service: FakeService, name: str, reply: Reply) -> None:
    with pytest.raises(ResponseFormatError):
        ROUTES[name](service.reply(reply).client())
    assert len(service.requests) == 1


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


# === may_have_been_billed: may a caller resend on its own? ===============================================


def status_reply(status: int) -> Reply:
    return Reply(status, json={"error": {"message": f"status {status}"}})


BILLED_CASES: list[tuple[str, str, list[Reply], type[GatewayError], bool, list[float]]] = [
    ("native no answer", "native", [Reply(error=httpx.ReadTimeout)], OutcomeUnknownError, True, []),
    ("native 500", "native", [status_reply(500)], ServerError, True, []),
    ("native 503", "native", [status_reply(503)], ServerError, False, []),
    ("native 429", "native", [status_reply(429)], RateLimitError, False, []),
    ("native 200 not json", "native", [Reply(content=b"<html>")], ResponseFormatError, True, []),
    ("native 200 bad image", "native", [MALFORMED[4][1]], ResponseFormatError, True, []),
    ("native refused", "native", [Reply(error=httpx.ConnectError)], ServiceUnreachableError, False, []),
    (
        "images no answer then 503s",
        "images_generations",
        [Reply(error=httpx.ReadTimeout), status_reply(503), status_reply(503), status_reply(503)],
        ServerError,
        True,
        [3, 8, 15],
    ),
    ("images 503s", "images_generations", [status_reply(503)] * 4, ServerError, False, [3, 8, 15]),
    (
        "images final 500",
        "images_generations",
        [status_reply(503)] * 3 + [status_reply(500)],
        ServerError,
        True,
        [3, 8, 15],
    ),
    (
        "images no answer then refused",
        "images_generations",
        [Reply(error=httpx.ReadTimeout)] + [Reply(error=httpx.ConnectError)] * 3,
        ServiceUnreachableError,
        True,
        [3, 8, 15],
    ),
    (
        "images no answer then 400",
        "images_edits",
        [Reply(error=httpx.ReadTimeout), status_reply(400)],
        BadRequestError,
        True,
        [3],
    ),
    (
        "messages refused then no answer",
        "messages",
        [Reply(error=httpx.ConnectError)] * 3 + [Reply(error=httpx.ReadError)],
        OutcomeUnknownError,
        True,
        [3, 8, 15],
    ),
    (
        "messages refused",
        "messages",
        [Reply(error=httpx.ConnectError)] * 4,
        ServiceUnreachableError,
        False,
        [3, 8, 15],
    ),
]


@pytest.mark.parametrize(
    ("name", "replies", "cls", "billed", "delays"),
    [c[1:] for c in BILLED_CASES],
    ids=[c[0] for c in BILLED_CASES],
)
def test_may_have_been_billed(
    service: FakeService,
    name: str,
    replies: list[Reply],
    cls: type[GatewayError],
    billed: bool,
    delays: list[float],
) -> None:
    with pytest.raises(GatewayError) as info:
        ROUTES[name](service.reply(*replies).client())
    assert type(info.value) is cls
    assert info.value.may_have_been_billed is billed
    assert service.delays == delays
    assert len(service.requests) == len(delays) + 1
    # The flag is set on the raised instance, never on the class every later error shares.
    assert ServerError("x", status_code=503).may_have_been_billed is False
    assert ServiceUnreachableError("x").may_have_been_billed is False


@pytest.mark.parametrize("name", ["native", "images_generations"])
def test_a_local_protocol_error_is_not_sent(service: FakeService, name: str) -> None:
    # httpx raises LocalProtocolError before writing the request (e.g. a header it refuses to encode).
    client = service.reply(Reply(error=httpx.LocalProtocolError)).client()
    with pytest.raises(ServiceUnreachableError) as info:
        ROUTES[name](client, observer=service.observe)
    assert info.value.may_have_been_billed is False
    finished = [e for e in service.events() if isinstance(e, AttemptFinished)]
    assert finished and {e.outcome for e in finished} == {"not_sent"}
    assert {e.status for e in finished} == {None}
    assert "LocalProtocolError" in (finished[-1].error_message or "")


def test_native_auth_must_be_a_known_scheme(service: FakeService) -> None:
    with pytest.raises(ConfigurationError, match="native_auth") as info:
        service.client(native_auth="other")
    assert KEY not in str(info.value)
    assert service.requests == []


def test_no_repr_shows_the_key(service: FakeService, monkeypatch: pytest.MonkeyPatch) -> None:
    from imagebatch.gateway.requests import GatewayRequest

    sent: list[tuple[GatewayRequest, httpx.Request]] = []
    real_send = GatewayClient.send

    def spy(self: GatewayClient, request: GatewayRequest, **kw: Any) -> Any:
        result = real_send(self, request, **kw)
        sent.append((request, fake.requests[-1]))
        return result

    monkeypatch.setattr(GatewayClient, "send", spy)
    cases = [(name, {"native_auth": "bearer"}) for name in ALL_ROUTES] + [("native", {})]
    for name, options in cases:
        fake = FakeService().reply(ROUTES[name].ok)
        ROUTES[name](fake.client(**options))
        fake.close()
    assert len(sent) == len(ALL_ROUTES) + 1
    for request, wire in sent:
        assert any(KEY in v for v in wire.headers.values())  # the key is on the wire ...
        assert KEY not in repr(request) and KEY not in str(request)  # ... and in no object that shows it
    client = service.client()
    assert KEY not in repr(client) and KEY not in str(client)


@pytest.mark.parametrize(
    ("base_url", "reason"),
    [
        ("http://no-such-host.invalid", "ConnectError (the host name did not resolve)"),
        ("http://127.0.0.1:9", "ConnectError (connection refused)"),
    ],
    ids=["dns", "refused"],
)
def test_an_unreachable_service_says_why(base_url: str, reason: str) -> None:
    """Real sockets: a name that does not resolve and a port nobody listens on are told apart."""
    with GatewayClient(base_url, "k" * 32, sleep=lambda _s: None) as client:
        with pytest.raises(ServiceUnreachableError) as info:
            ROUTES["native"](client)
    assert info.value.message == f"could not send to {base_url}: {reason}"
