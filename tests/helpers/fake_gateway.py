"""The one fake of the service for the client's and the tasks' tests: an `httpx.MockTransport` handler that
records every request and plays back scripted replies (then a default answer, when it has one), the six
routes' valid requests and answers, and body builders."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from helpers.images import jpeg, mask, png
from imagebatch.gateway import (
    AttemptFinished,
    AttemptStarted,
    GatewayClient,
    ImageUpload,
)
from imagebatch.gateway.constants import Route
from imagebatch.gateway.errors import (
    AuthenticationError,
    BadRequestError,
    InsufficientFundsError,
    NotFoundError,
)

KEY = "sk-svc-0123456789abcdef-SECRET"
BASE = "http://gateway.test"
IDEM = "job-7:0:3f2a9c"


# --- images, bodies and replies ------------------------------------------------------------------------


PNG = png(8, 8)
PNG_WIDE = png(8, 4)
JPEG = jpeg(6, 8)
MASK = mask(8, 8)


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


Scripted = Reply | dict[str, Any] | bytes | tuple[int, Any] | type[httpx.TransportError]
"""A reply, or one of its short forms: a dict (200 JSON), bytes (a 200 raw body), a (status, JSON body)
tuple, or a transport error class (raised instead of answering)."""


def as_reply(scripted: Scripted) -> Reply:
    if isinstance(scripted, Reply):
        return scripted
    if isinstance(scripted, type):
        return Reply(error=scripted)
    if isinstance(scripted, bytes):
        return Reply(content=scripted)
    if isinstance(scripted, tuple):
        return Reply(status=scripted[0], json=scripted[1])
    return Reply(json=scripted)


class FakeService:
    """A MockTransport handler that records requests and plays replies: the script's in order, then
    `default(request, n)` for the n-th request when there is one, else the script's last one again.

    `log` is one timeline shared by the handler, the observer and the sleep function, so a test can
    assert the order of "reported", "sent" and "waited".
    """

    def __init__(self, default: Callable[[httpx.Request, int], Scripted] | None = None) -> None:
        self.default = default
        self.requests: list[httpx.Request] = []
        self.answers: list[Reply] = []
        """What each request was answered."""
        self.log: list[Any] = []
        self.delays: list[float] = []
        self._replies: list[Reply] = []
        self._clients: list[GatewayClient] = []

    def reply(self, *replies: Scripted) -> FakeService:
        self._replies.extend(as_reply(r) for r in replies)
        return self

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.log.append(("sent", len(self.requests)))
        if self.default is not None and not self._replies:
            reply = as_reply(self.default(request, len(self.requests)))
        else:
            assert self._replies, "the client sent a request the test did not expect"
            reply = self._replies.pop(0) if len(self._replies) > 1 or self.default else self._replies[0]
        self.answers.append(reply)
        return reply.build(request)

    @property
    def count(self) -> int:
        return len(self.requests)

    def body(self, i: int) -> Any:
        """The JSON body of the `i`-th request (from 0)."""
        return json.loads(self.requests[i].content)

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
