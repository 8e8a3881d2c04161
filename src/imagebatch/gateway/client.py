"""GatewayClient: sends the requests of `requests.py` with the spec's auth, timeouts and retries, on httpx.

Every request carries the caller's `Idempotency-Key`, the same on every attempt. Each attempt is reported
to an observer before it is sent and after it returns, so a caller can keep a write-ahead journal. The API
key is only ever placed in request headers; everything the service sends back (bodies, error messages,
request ids) is cleared of it in one place (`_answer`) before anyone reads it.
"""

from __future__ import annotations

import logging
import re
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

import httpx

from . import requests as build
from .compat_models import ChatRequest, ImagesRequest, MessagesRequest, ResponsesRequest
from .constants import (
    COMPAT_VERSION_HEADER,
    CONNECT_TIMEOUT,
    DEFAULT_COMPAT_VERSION,
    ENV_API_KEY,
    IDEMPOTENCY_HEADER,
    IMAGE_TIMEOUT,
    MESSAGES_KEY_HEADER,
    NATIVE_KEY_HEADER,
    TEXT_TIMEOUT,
    Route,
)
from .errors import (
    APIStatusError,
    ConfigurationError,
    GatewayError,
    OutcomeUnknownError,
    RequestValidationError,
    ResponseFormatError,
    ServiceUnreachableError,
    error_for_status,
)
from .models import NativeRequest
from .readers import Result, read_result, request_id_of
from .redaction import redact, redact_json
from .requests import GatewayRequest
from .results import (
    AttemptEvent,
    AttemptFinished,
    AttemptObserver,
    AttemptStarted,
    GenerationResult,
    ImageUpload,
    TextResult,
)
from .retry import RetryPolicy, parse_retry_after, policy_for, was_never_sent

logger = logging.getLogger("imagebatch.gateway")


def _log_retry(event: AttemptFinished) -> None:
    """One log line per retry (a Prefect flow forwards this logger to its run log)."""
    logger.warning(
        "%s %s (key %s) attempt %d failed: %s; retrying in %g s",
        event.route,
        event.model,
        event.idempotency_key,
        event.attempt,
        describe_attempt(event),
        event.retry_in,
    )


def _log_unanswered(event: AttemptFinished) -> None:
    """The line that says why an unanswered attempt is the last one (a run's log shows it beside the
    retries)."""
    logger.warning(
        "%s %s (key %s) attempt %d: %s; not resent automatically (its outcome is unknown until checked "
        "in the service's usage history)",
        event.route,
        event.model,
        event.idempotency_key,
        event.attempt,
        event.error_message,
    )


def _ignore(event: AttemptEvent) -> None:
    pass


def describe_attempt(event: AttemptFinished) -> str:
    """`HTTP 503 service_unavailable`, or what went wrong when no answer came back."""
    if event.status is not None:
        return f"HTTP {event.status} {event.error_code or ''}".strip()
    return event.error_message or event.outcome


class _Attempt:
    """One attempt of a request: reports its start to the observer when made, and its end by `finished`."""

    def __init__(
        self, notify: AttemptObserver, route: Route, model: str, idempotency_key: str, attempt: int
    ) -> None:
        self.notify, self.route, self.attempt = notify, route, attempt
        started_at, self.t0 = datetime.now(UTC), time.monotonic()
        self.ids = (route, model, idempotency_key, attempt, started_at)
        notify(AttemptStarted(*self.ids))

    def finished(self, status: int | None, outcome: Any, retry_in: float | None = None, **kw: Any) -> None:
        duration = time.monotonic() - self.t0
        event = AttemptFinished(*self.ids, duration, status, outcome, retry_in=retry_in, **kw)
        self.notify(event)
        if retry_in is not None:
            _log_retry(event)
        elif outcome == "no_answer":
            _log_unanswered(event)


class _Failed(NamedTuple):
    """An attempt's error, and the wait before the next attempt (None: there is none)."""

    error: GatewayError
    delay: float | None


class GatewayClient:
    """A synchronous client for the six routes of the service.

    `base_url` is the service root (no `/v1` or `/v1beta`: those are added per route, and a base URL that
    ends in one is refused with a clear error rather than silently rewritten, since it usually means the
    user copied an SDK setting). `sleep` and `transport` are injectable for tests. `slot` is entered around
    each attempt while it is on the wire (not during a retry's wait): a run passes a slot of a Prefect
    global concurrency limit shared by every run and machine of an account (`run.limits`).

    Build a request with `imagebatch.gateway.requests` and `send` it, as a run does (`work.send`). The
    route methods below are the public typed API for a caller with a body given whole (as an SDK user
    would write it): one call per route, the body checked by the same builders, then `send`. Kept for
    that caller and for the client's tests, which drive each route through them; a run never needs them.
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
        slot: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        self.base_url = normalise_base_url(base_url)
        if native_auth not in ("x-native-api-key", "bearer"):
            raise ConfigurationError(f"native_auth must be x-native-api-key or bearer, not {native_auth!r}")
        if not api_key:
            raise ConfigurationError(f"an API key is required (set {ENV_API_KEY})")
        self._api_key = api_key
        self._native_auth = native_auth
        self._compat_version = compat_version
        self._image_timeout = image_timeout
        self._text_timeout = text_timeout
        self._connect_timeout = connect_timeout
        self._sleep = sleep
        self._policies = dict(policies or {})
        self._slot = slot
        self._transport = transport
        self._ssl: ssl.SSLContext | None = None
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._clients_lock = threading.Lock()

    def __repr__(self) -> str:  # never show the key
        return f"GatewayClient(base_url={self.base_url!r})"

    def close(self) -> None:
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    @property
    def _http(self) -> httpx.Client:
        """This thread's connection to the service: a thread sends one request at a time, so each keeps
        its own (kept alive between its requests). One pool shared by hundreds of threads spends more CPU
        on its bookkeeping than on the requests (httpcore's pool scans every connection for every request:
        at 64 connections most of a run's CPU, bench/README.md). One TLS context serves them all (making one
        costs ~50 ms)."""
        client: httpx.Client | None = getattr(self._local, "http", None)
        if client is None:
            with self._clients_lock:
                if self._ssl is None:
                    self._ssl = httpx.create_ssl_context()
                client = httpx.Client(
                    base_url=self.base_url,
                    transport=self._transport,
                    follow_redirects=False,
                    verify=self._ssl,
                )
                self._clients.append(client)
            self._local.http = client
        return client

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- routes, with a body given whole --

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
        req = build.native_body(model, request, max_images=max_images)
        return self.send(req, idempotency_key=idempotency_key, observer=observer)  # type: ignore[return-value]

    def chat_completions(
        self,
        request: ChatRequest | Mapping[str, Any],
        *,
        idempotency_key: str,
        max_images: int | None = None,
        observer: AttemptObserver | None = None,
    ) -> GenerationResult:
        """`POST /v1/chat/completions` with a native image model: one attempt (it generates billed images)."""
        req = build.chat_body(request, max_images=max_images)
        return self.send(req, idempotency_key=idempotency_key, observer=observer)  # type: ignore[return-value]

    def images_generate(
        self,
        request: ImagesRequest | Mapping[str, Any],
        *,
        idempotency_key: str,
        observer: AttemptObserver | None = None,
    ) -> GenerationResult:
        """`POST /v1/images/generations` (JSON), retried on the spec's schedule."""
        req = build.images_generation_body(request)
        return self.send(req, idempotency_key=idempotency_key, observer=observer)  # type: ignore[return-value]

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
        req = build.images_edit_body(request, images, mask=mask)
        return self.send(req, idempotency_key=idempotency_key, observer=observer)  # type: ignore[return-value]

    def messages(
        self,
        request: MessagesRequest | Mapping[str, Any],
        *,
        idempotency_key: str,
        observer: AttemptObserver | None = None,
    ) -> TextResult:
        """`POST /v1/messages`: `x-api-key` and `compat-version`, never Bearer."""
        req = build.messages_body(request)
        return self.send(req, idempotency_key=idempotency_key, observer=observer)  # type: ignore[return-value]

    def responses(
        self,
        request: ResponsesRequest | Mapping[str, Any],
        *,
        idempotency_key: str,
        observer: AttemptObserver | None = None,
    ) -> TextResult:
        """`POST /v1/responses` with a Bearer key."""
        req = build.responses_body(request)
        return self.send(req, idempotency_key=idempotency_key, observer=observer)  # type: ignore[return-value]

    # -- sending --

    def _auth(self, route: Route) -> dict[str, str]:
        if route is Route.MESSAGES:
            return {MESSAGES_KEY_HEADER: self._api_key, COMPAT_VERSION_HEADER: self._compat_version}
        if route is Route.NATIVE and self._native_auth == "x-native-api-key":
            return {NATIVE_KEY_HEADER: self._api_key}
        return {"Authorization": f"Bearer {self._api_key}"}

    def _policy(self, route: Route) -> RetryPolicy:
        return self._policies.get(route) or policy_for(route)

    def send(
        self,
        request: GatewayRequest,
        *,
        idempotency_key: str,
        observer: AttemptObserver | None = None,
    ) -> Result:
        """Send `request` under `idempotency_key`, retrying on the route's schedule; return what came back.

        Raises a `GatewayError`; its `may_have_been_billed` says whether the last attempt may have been
        generated (no answer, an unreadable 200, a final 500), in which case the caller must not resend.
        An attempt that may have reached the service and got no answer ends the request on every route
        (`OutcomeUnknownError`); only an attempt that never left (`retry.was_never_sent`) or an answer
        with a retryable status is retried on the route's schedule.
        """
        if not idempotency_key:
            raise RequestValidationError("an idempotency key is required")
        notify: AttemptObserver = observer or _ignore
        route, model = request.route, request.model
        policy = self._policy(route)
        headers = {**self._auth(route), **request.headers, IDEMPOTENCY_HEADER: idempotency_key}
        seconds = self._image_timeout if route.generates_images else self._text_timeout
        timeout = httpx.Timeout(seconds, connect=min(self._connect_timeout, seconds))
        files = [(name, (up.filename, up.data, up.mime_type)) for name, up in request.files] or None
        for attempt in range(1, policy.max_attempts + 1):
            # The account-wide limit's slot (if any) is held while the attempt is on the wire, never
            # during a retry's wait.
            with self._slot():
                tried = _Attempt(notify, route, model, idempotency_key, attempt)
                try:
                    response = self._http.post(
                        request.path,
                        headers=headers,
                        json=request.json,
                        data=request.form,
                        files=files,
                        timeout=timeout,
                    )
                except httpx.RequestError as exc:
                    failed = self._unanswered(exc, tried, policy)
                else:
                    outcome = self._read(response, tried, policy)
                    if not isinstance(outcome, _Failed):
                        return outcome
                    failed = outcome
                    failed.error.may_have_been_billed = response.status_code == 500
            if failed.delay is None:
                raise failed.error
            self._sleep(failed.delay)
        raise AssertionError("unreachable: the last attempt has no retry delay")  # pragma: no cover

    def _unanswered(self, exc: httpx.RequestError, tried: _Attempt, policy: RetryPolicy) -> _Failed:
        """An attempt that got no answer: never sent (`ServiceUnreachableError`, retried on the schedule),
        or possibly sent with no answer back (`OutcomeUnknownError`: it may have been generated and
        billed, so it is final on every route)."""
        delay = policy.delay_after_transport_error(tried.attempt, exc)
        error: GatewayError
        if was_never_sent(exc):
            message = f"could not send to {self.base_url}: {_transport_reason(exc)}"
            tried.finished(None, "not_sent", delay, error_message=message)
            error = ServiceUnreachableError(message, attempts=tried.attempt)
        else:
            message = f"no answer from the service ({type(exc).__name__}); it may have been billed"
            tried.finished(None, "no_answer", delay, error_message=message)
            error = OutcomeUnknownError(message, attempts=tried.attempt)
        return _Failed(error, delay)

    def _read(self, response: httpx.Response, tried: _Attempt, policy: RetryPolicy) -> Result | _Failed:
        """What an answer says: a result, or an error and the wait before the next attempt; a success
        status whose body cannot be read raises at once (final: it may have been generated)."""
        status, attempt = response.status_code, tried.attempt
        request_id, body, failure = self._answer(response, attempt)
        if failure is None:
            try:
                result = read_result(tried.route, body, request_id, attempt)
            except ResponseFormatError as exc:
                failure = ResponseFormatError(exc.message, request_id=request_id, attempts=attempt)
            else:
                images = len(getattr(result, "images", []))
                tried.finished(status, "ok", request_id=request_id, images=images, usage=result.usage)
                return result
        if isinstance(failure, ResponseFormatError):  # a success status we cannot read: final
            tried.finished(
                status, "error", request_id=request_id,
                error_code="bad_response", error_message=failure.message,
            )  # fmt: skip
            raise failure
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        delay = policy.delay_before_retry(attempt, status, retry_after)
        tried.finished(
            status, "error", delay, request_id=request_id,
            error_code=failure.code, error_message=failure.message,
        )  # fmt: skip
        return _Failed(failure, delay)

    def _answer(
        self, response: httpx.Response, attempt: int
    ) -> tuple[str | None, Any, APIStatusError | ResponseFormatError | None]:
        """(request id, JSON body, error) of an answer, every string the service sent cleared of the key."""
        request_id = redact(rid, self._api_key) if (rid := request_id_of(response)) else None
        if response.status_code >= 400:
            error = error_for_status(
                response.status_code,
                response.content,
                request_id=request_id,
                attempts=attempt,
                secret=self._api_key,
            )
            return request_id, None, error
        try:
            body = response.json()
        except ValueError:
            return (
                request_id,
                None,
                ResponseFormatError("body is not JSON", request_id=request_id, attempts=attempt),
            )
        return request_id, redact_json(body, self._api_key), None  # text, history, usage: all of it


def _transport_reason(exc: httpx.RequestError) -> str:
    """Say whether the name did not resolve or the connection was refused, not only the exception's name."""
    text = str(exc).lower()
    if "name or service not known" in text or "nodename nor servname" in text or "name resolution" in text:
        return f"{type(exc).__name__} (the host name did not resolve)"
    if "refused" in text:
        return f"{type(exc).__name__} (connection refused)"
    return type(exc).__name__


_USERINFO = re.compile(r"^\s*(?:[A-Za-z][A-Za-z0-9+.-]*:)?(?://)?[^/?#]*@")
"""A user name or password before the host (`http://user:PASS@host`), with or without a scheme."""


def normalise_base_url(base_url: str) -> str:
    """Check and tidy a service root: scheme required, no `/v1` or `/v1beta` suffix, no trailing slash.

    A base URL with a user name or password in it is refused, and the message does not repeat the URL:
    it would otherwise be stored in run.json and Prefect's flow-run parameters (the key goes in a header,
    from `IMAGEBATCH_API_KEY` or a Secret block, never in the URL)."""
    if _USERINFO.match(base_url):
        raise ConfigurationError(
            "base URL must not hold a user name or password (user:password@host): give the service root "
            f"alone, and the API key in {ENV_API_KEY} or a Prefect Secret block"
        )
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
