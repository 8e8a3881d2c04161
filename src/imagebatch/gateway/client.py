"""GatewayClient: one method per route of the service, on httpx, with the spec's auth, timeouts and retries.

Every request carries the caller's `Idempotency-Key`, the same on every attempt. Each attempt is reported
to an observer before it is sent and after it returns, so a caller can keep a write-ahead journal. The API
key is only ever placed in request headers; it never appears in an exception, a log line or a result.
"""

from __future__ import annotations

import base64
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from .constants import (
    COMPAT_IMAGE_MODEL,
    COMPAT_VERSION_HEADER,
    CONNECT_TIMEOUT,
    DEFAULT_COMPAT_VERSION,
    DEFAULT_MAX_TOKENS,
    IDEMPOTENCY_HEADER,
    IMAGE_TIMEOUT,
    MAX_IMAGES_HEADER,
    MAX_IMAGES_MAX,
    MAX_IMAGES_MIN,
    MESSAGES_KEY_HEADER,
    NATIVE_KEY_HEADER,
    TEXT_TIMEOUT,
    Route,
    model_refusal,
)
from .errors import (
    ConfigurationError,
    GatewayError,
    OutcomeUnknownError,
    RequestValidationError,
    ResponseFormatError,
    ServiceUnreachableError,
    error_for_status,
    redact,
)
from .imagefile import NotAnImageError, inspect_image
from .models import (
    ChatRequest,
    ChatResponse,
    ImagesRequest,
    ImagesResponse,
    MessagesRequest,
    NativeRequest,
    NativeResponse,
    ResponsesRequest,
    describe_validation_error,
)
from .retry import RetryPolicy, policy_for

logger = logging.getLogger("imagebatch.gateway")

REQUEST_ID_HEADERS = ("x-request-id", "request-id", "x-service-request-id")
_DATA_URL = re.compile(r"data:(image/(?:png|jpeg));base64,([A-Za-z0-9+/=]+)")
_MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*data:image/(?:png|jpeg);base64,[A-Za-z0-9+/=]+\s*\)")


# --- what the caller gets back -----------------------------------------------------------------------


@dataclass(frozen=True)
class GeneratedImage:
    """One final image, its type and size read from its bytes (not from what the response declared)."""

    data: bytes
    mime_type: str
    width: int
    height: int


@dataclass(frozen=True)
class ImageResult:
    """A generation that delivered one or more final images."""

    images: list[GeneratedImage]
    text: str | None = None
    finish_reason: str | None = None
    prompt_feedback: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    request_id: str | None = None
    attempts: int = 1
    model_content: dict[str, Any] | None = None
    """Native route: the candidate's complete `content`, to send back unaltered in an edit history."""


@dataclass(frozen=True)
class NoImageResult:
    """A 200 answer that carries no final image (safety, refusal): what the service said instead."""

    text: str | None = None
    finish_reason: str | None = None
    prompt_feedback: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    request_id: str | None = None
    attempts: int = 1
    model_content: dict[str, Any] | None = None


@dataclass(frozen=True)
class TextResult:
    """The answer of a text relay route: its text, usage, and the whole body as returned."""

    text: str
    raw: dict[str, Any]
    usage: dict[str, Any] | None = None
    request_id: str | None = None
    attempts: int = 1


GenerationResult = ImageResult | NoImageResult


@dataclass(frozen=True)
class ImageUpload:
    """A file for the multipart edits route."""

    data: bytes
    filename: str = "image.png"
    mime_type: str = "image/png"


# --- attempt reporting ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptStarted:
    """Reported before an attempt is sent."""

    route: Route
    model: str
    idempotency_key: str
    attempt: int
    started_at: datetime


@dataclass(frozen=True)
class AttemptFinished:
    """Reported after an attempt returned (or failed to)."""

    route: Route
    model: str
    idempotency_key: str
    attempt: int
    started_at: datetime
    duration: float
    status: int | None
    """HTTP status, or None when no answer came back."""
    outcome: Literal["ok", "error", "no_answer", "not_sent"]
    request_id: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    retry_in: float | None = None
    """The wait before the next attempt, or None when this was the last."""
    images: int = 0
    usage: dict[str, Any] | None = None


AttemptEvent = AttemptStarted | AttemptFinished


class AttemptObserver(Protocol):
    def __call__(self, event: AttemptEvent, /) -> None: ...


# --- request building helpers --------------------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)


def _validated(model_cls: type[M], body: M | Mapping[str, Any], **context: Any) -> M:
    if isinstance(body, model_cls):
        body = body.model_dump(mode="json", exclude_none=True)
    try:
        return model_cls.model_validate(body, context=context or None)
    except ValidationError as exc:
        code, message = describe_validation_error(exc)
        raise RequestValidationError(message, code=code) from None


def _with_defaults(body: BaseModel | Mapping[str, Any], **defaults: Any) -> BaseModel | Mapping[str, Any]:
    """Fill the spec's stated defaults of required fields, so they are always sent explicitly."""
    return body if isinstance(body, BaseModel) else {**defaults, **body}


def _dump(body: BaseModel) -> dict[str, Any]:
    return body.model_dump(mode="json", exclude_none=True)


def _check_max_images(value: int | None) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, bool) or not isinstance(value, int) or not MAX_IMAGES_MIN <= value <= MAX_IMAGES_MAX:
        raise RequestValidationError(
            f"{MAX_IMAGES_HEADER} must be an integer from {MAX_IMAGES_MIN} to {MAX_IMAGES_MAX}, not {value!r}"
        )
    return {MAX_IMAGES_HEADER: str(value)}


def _decode_image(data_b64: str, where: str) -> GeneratedImage:
    try:
        raw = base64.b64decode(data_b64, validate=True)
    except ValueError:
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
    text = _MARKDOWN_IMAGE.sub("", content)
    text = _DATA_URL.sub("", text).strip() or None
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


def _request_id(response: httpx.Response) -> str | None:
    for name in REQUEST_ID_HEADERS:
        if name in response.headers:
            return response.headers[name]
    return None


# --- the client ----------------------------------------------------------------------------------------


@dataclass
class _Call:
    """One logical request: everything needed to send it (again) and read its answer."""

    route: Route
    model: str
    idempotency_key: str
    headers: dict[str, str] = field(repr=False)  # holds the key: never in a repr
    json: dict[str, Any] | None = None
    data: dict[str, str] | None = None
    files: list[tuple[str, tuple[str, bytes, str]]] | None = None
    observer: AttemptObserver | None = None

    @property
    def path(self) -> str:
        return self.route.path.format(model=self.model)


class GatewayClient:
    """A synchronous client for the six routes of the service.

    `base_url` is the service root (no `/v1` or `/v1beta`: those are added per route, and a base URL that
    ends in one is refused with a clear error rather than silently rewritten, since it usually means the
    user copied an SDK setting). `sleep` and `transport` are injectable for tests.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        native_auth: Literal["x-native-api-key", "bearer"] = "x-native-api-key",
        compat_version: str = DEFAULT_COMPAT_VERSION,
        image_timeout: float = IMAGE_TIMEOUT,
        text_timeout: float = TEXT_TIMEOUT,
        connect_timeout: float = CONNECT_TIMEOUT,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
        policies: Mapping[Route, RetryPolicy] | None = None,
    ) -> None:
        self.base_url = normalise_base_url(base_url)
        if native_auth not in ("x-native-api-key", "bearer"):
            raise ConfigurationError(f"native_auth must be x-native-api-key or bearer, not {native_auth!r}")
        if not api_key:
            raise ConfigurationError("an API key is required (set IMAGEBATCH_API_KEY)")
        self._api_key = api_key
        self._native_auth = native_auth
        self._compat_version = compat_version
        self._image_timeout = image_timeout
        self._text_timeout = text_timeout
        self._connect_timeout = connect_timeout
        self._sleep = sleep
        self._policies = dict(policies or {})
        self._http = httpx.Client(base_url=self.base_url, transport=transport, follow_redirects=False)

    def __repr__(self) -> str:  # never show the key
        return f"GatewayClient(base_url={self.base_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- routes --

    def generate_content(
        self,
        model: str,
        request: NativeRequest | Mapping[str, Any],
        *,
        idempotency_key: str,
        max_images: int | None = None,
        observer: AttemptObserver | None = None,
    ) -> GenerationResult:
        """`POST /v1beta/models/{model}:generateContent`: one attempt, never retried automatically."""
        refusal = model_refusal(Route.NATIVE, model)
        if refusal is not None:
            raise RequestValidationError(refusal[1], code=refusal[0])
        body = _validated(NativeRequest, request, model=model)
        auth = (
            {NATIVE_KEY_HEADER: self._api_key}
            if self._native_auth == "x-native-api-key"
            else {"Authorization": f"Bearer {self._api_key}"}
        )
        call = _Call(
            Route.NATIVE,
            model,
            idempotency_key,
            {**auth, **_check_max_images(max_images)},
            json=_dump(body),
            observer=observer,
        )
        return self._send(call, self._read_native)

    def chat_completions(
        self,
        request: ChatRequest | Mapping[str, Any],
        *,
        idempotency_key: str,
        max_images: int | None = None,
        observer: AttemptObserver | None = None,
    ) -> GenerationResult:
        """`POST /v1/chat/completions` with a native image model: one attempt (it generates billed images)."""
        body = _validated(ChatRequest, request)
        call = _Call(
            Route.CHAT,
            body.model,
            idempotency_key,
            {**self._bearer(), **_check_max_images(max_images)},
            json=_dump(body),
            observer=observer,
        )
        return self._send(call, self._read_chat)

    def images_generate(
        self,
        request: ImagesRequest | Mapping[str, Any],
        *,
        idempotency_key: str,
        observer: AttemptObserver | None = None,
    ) -> GenerationResult:
        """`POST /v1/images/generations` (JSON), retried on the spec's schedule."""
        body = _validated(ImagesRequest, _with_defaults(request, model=COMPAT_IMAGE_MODEL))
        call = _Call(
            Route.IMAGES_GENERATIONS,
            body.model,
            idempotency_key,
            self._bearer(),
            json=body.model_dump(mode="json"),
            observer=observer,
        )
        return self._send(call, self._read_images)

    def images_edit(
        self,
        request: ImagesRequest | Mapping[str, Any],
        images: Sequence[ImageUpload],
        *,
        mask: ImageUpload | None = None,
        idempotency_key: str,
        observer: AttemptObserver | None = None,
    ) -> GenerationResult:
        """`POST /v1/images/edits` as multipart: `image` for one file, `image[]` repeated for several."""
        body = _validated(ImagesRequest, _with_defaults(request, model=COMPAT_IMAGE_MODEL))
        if not images:
            raise RequestValidationError("an edit needs at least one reference image")
        name = "image" if len(images) == 1 else "image[]"
        files = [(name, (img.filename, img.data, img.mime_type)) for img in images]
        if mask is not None:
            files.append(("mask", (mask.filename, mask.data, mask.mime_type)))
        fields = {k: str(v) for k, v in body.model_dump(mode="json").items()}
        call = _Call(
            Route.IMAGES_EDITS,
            body.model,
            idempotency_key,
            self._bearer(),
            data=fields,
            files=files,
            observer=observer,
        )
        return self._send(call, self._read_images)

    def messages(
        self,
        request: MessagesRequest | Mapping[str, Any],
        *,
        idempotency_key: str,
        observer: AttemptObserver | None = None,
    ) -> TextResult:
        """`POST /v1/messages`: `x-api-key` and `compat-version`, never Bearer."""
        body = _validated(MessagesRequest, _with_defaults(request, max_tokens=DEFAULT_MAX_TOKENS))
        headers = {MESSAGES_KEY_HEADER: self._api_key, COMPAT_VERSION_HEADER: self._compat_version}
        call = _Call(
            Route.MESSAGES,
            body.model,
            idempotency_key,
            headers,
            json=_dump(body),
            observer=observer,
        )
        return self._send(call, self._read_text)

    def responses(
        self,
        request: ResponsesRequest | Mapping[str, Any],
        *,
        idempotency_key: str,
        observer: AttemptObserver | None = None,
    ) -> TextResult:
        """`POST /v1/responses` with a Bearer key."""
        body = _validated(ResponsesRequest, request)
        call = _Call(
            Route.RESPONSES,
            body.model,
            idempotency_key,
            self._bearer(),
            json=_dump(body),
            observer=observer,
        )
        return self._send(call, self._read_text)

    # -- internals --

    def _bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"}

    def _policy(self, route: Route) -> RetryPolicy:
        return self._policies.get(route) or policy_for(route)

    def _send(self, call: _Call, reader: Callable[[_Call, Any, str | None, int], Any]) -> Any:
        if not call.idempotency_key:
            raise RequestValidationError("an idempotency key is required")
        policy = self._policy(call.route)
        headers = {**call.headers, IDEMPOTENCY_HEADER: call.idempotency_key}
        seconds = self._image_timeout if call.route.generates_images else self._text_timeout
        timeout = httpx.Timeout(seconds, connect=min(self._connect_timeout, seconds))
        attempt = 0
        unanswered = False  # some attempt got no answer: it may have been generated and billed
        while True:
            attempt += 1
            started_at = datetime.now(UTC)
            t0 = time.monotonic()
            notify = call.observer or (lambda _event: None)
            notify(AttemptStarted(call.route, call.model, call.idempotency_key, attempt, started_at))

            def finished(**kw: Any) -> AttemptFinished:
                event = AttemptFinished(
                    call.route,
                    call.model,
                    call.idempotency_key,
                    attempt,  # noqa: B023 - read at once, inside this iteration
                    started_at,  # noqa: B023
                    time.monotonic() - t0,  # noqa: B023
                    **kw,
                )
                notify(event)  # noqa: B023
                return event

            try:
                response = self._http.post(
                    call.path,
                    headers=headers,
                    json=call.json,
                    data=call.data,
                    files=call.files,
                    timeout=timeout,
                )
            except (
                httpx.ConnectError,
                httpx.ConnectTimeout,
                httpx.UnsupportedProtocol,
                httpx.LocalProtocolError,
            ) as exc:
                # The request never left this machine, so this attempt cannot have been generated or billed.
                message = f"could not send to {self.base_url}: {type(exc).__name__}"
                delay = policy.delay_before_retry(attempt, None)
                finished(status=None, outcome="not_sent", error_message=message, retry_in=delay)
                if delay is None:
                    unreachable = ServiceUnreachableError(message, attempts=attempt)
                    unreachable.may_have_been_billed = unanswered
                    raise unreachable from None
                self._wait(call, attempt, delay, message)
                continue
            except httpx.TransportError as exc:
                message = (
                    f"no answer from the service ({type(exc).__name__}); the request may have been billed"
                )
                delay = policy.delay_before_retry(attempt, None)
                unanswered = True
                finished(status=None, outcome="no_answer", error_message=message, retry_in=delay)
                if delay is None:
                    raise OutcomeUnknownError(message, attempts=attempt) from None
                self._wait(call, attempt, delay, message)
                continue

            request_id = _request_id(response)
            if response.status_code >= 400:
                error = error_for_status(
                    response.status_code,
                    response.content,
                    request_id=request_id,
                    attempts=attempt,
                    secret=self._api_key,
                )
                delay = policy.delay_before_retry(attempt, response.status_code)
                finished(
                    status=response.status_code,
                    outcome="error",
                    request_id=request_id,
                    error_code=error.code,
                    error_message=error.message,
                    retry_in=delay,
                )
                if delay is None:
                    error.may_have_been_billed = unanswered or response.status_code == 500
                    raise error
                self._wait(call, attempt, delay, str(error))
                continue

            try:
                body = response.json()
                result = reader(call, body, request_id, attempt)
            except (ValueError, ResponseFormatError) as exc:
                message = redact(
                    str(exc) if isinstance(exc, GatewayError) else "body is not JSON", self._api_key
                )
                finished(
                    status=response.status_code,
                    outcome="error",
                    request_id=request_id,
                    error_code="bad_response",
                    error_message=message,
                )
                raise ResponseFormatError(message, request_id=request_id, attempts=attempt) from None
            images = len(getattr(result, "images", []))
            finished(
                status=response.status_code,
                outcome="ok",
                request_id=request_id,
                images=images,
                usage=getattr(result, "usage", None),
            )
            return result

    def _wait(self, call: _Call, attempt: int, delay: float, why: str) -> None:
        logger.warning(
            "%s %s (key %s) attempt %d failed: %s; retrying in %g s",
            call.route,
            call.model,
            call.idempotency_key,
            attempt,
            redact(why, self._api_key),
            delay,
        )
        self._sleep(delay)

    @staticmethod
    def _read_native(call: _Call, body: Any, request_id: str | None, attempts: int) -> GenerationResult:
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

    @staticmethod
    def _read_chat(call: _Call, body: Any, request_id: str | None, attempts: int) -> GenerationResult:
        images, text, parsed = read_chat_response(body)
        common: dict[str, Any] = {
            "text": text,
            "finish_reason": parsed.choices[0].finish_reason,
            "usage": parsed.usage,
            "request_id": request_id,
            "attempts": attempts,
        }
        return ImageResult(images, **common) if images else NoImageResult(**common)

    @staticmethod
    def _read_images(call: _Call, body: Any, request_id: str | None, attempts: int) -> GenerationResult:
        images, parsed = read_images_response(body)
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
        revised = getattr(parsed.data[0], "revised_prompt", None)
        return ImageResult(
            images,
            text=revised if isinstance(revised, str) else None,
            usage=usage,
            request_id=request_id,
            attempts=attempts,
        )

    @staticmethod
    def _read_text(call: _Call, body: Any, request_id: str | None, attempts: int) -> TextResult:
        text = read_text(call.route, body)
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
        return TextResult(text=text, raw=body, usage=usage, request_id=request_id, attempts=attempts)


def normalise_base_url(base_url: str) -> str:
    """Check and tidy a service root: scheme required, no `/v1` or `/v1beta` suffix, no trailing slash."""
    url = base_url.strip().rstrip("/")
    try:
        parsed = httpx.URL(url) if url else None
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigurationError(f"base URL must be an http(s) address of the service root, not {base_url!r}")
    last = parsed.path.rstrip("/").rsplit("/", 1)[-1]
    if last in ("v1", "v1beta"):
        raise ConfigurationError(
            f"base URL must be the service root without /{last} (the client adds /v1 or /v1beta per route); "
            f"use {url[: -len(last) - 1]!r}"
        )
    return url
