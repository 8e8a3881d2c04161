"""GatewayClient retries (against the shared fake service): the spec's schedule per route, the attempt
observer and the mapping of errors (what follows a failure: test_client_billing.py). No real waiting: the
client's `sleep` records the delays it was asked for."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from helpers.fake_gateway import (
    IDEM,
    IMAGES_REQUEST,
    JPEG,
    KEY,
    NEVER_RETRIED,
    PNG,
    RETRYABLE_STATUSES,
    RETRYING_ROUTES,
    ROUTES,
    SINGLE_ATTEMPT_ROUTES,
    USAGE_METADATA,
    FakeService,
    Reply,
    image_part,
    images_body,
    native_body,
)

from imagebatch.gateway import (
    AttemptFinished,
    AttemptStarted,
)
from imagebatch.gateway.constants import Route
from imagebatch.gateway.errors import (
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    GatewayError,
    InsufficientFundsError,
    NotFoundError,
    OutcomeUnknownError,
    RateLimitError,
    ResponseFormatError,
    ServerError,
    ServiceUnreachableError,
    UnsupportedEndpointError,
)

NOT_AN_IMAGE = Reply(json=native_body(image_part(b"GIF89a not an image")))


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


SENT_NO_ANSWER = [
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
    httpx.DecodingError,
]
"""Errors of an attempt whose request may have reached the service: never resent automatically."""
NEVER_SENT = [httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout]
"""Errors raised before the request's bytes left: retried on the schedule like a 503."""


@pytest.mark.parametrize("name", RETRYING_ROUTES)
@pytest.mark.parametrize("error", SENT_NO_ANSWER)
def test_retrying_routes_never_resend_an_unanswered_attempt(
    service: FakeService, name: str, error: type[httpx.RequestError]
) -> None:
    """The spec (errors, case 2): a timeout or dropped connection is confirmed before any resend, since
    a resend can generate and bill it twice; the schedule is only for errors before sending and statuses."""
    with pytest.raises(OutcomeUnknownError, match="billed") as info:
        ROUTES[name](service.reply(Reply(error=error), ROUTES[name].ok).client())
    assert len(service.requests) == 1
    assert service.delays == []
    assert info.value.attempts == 1 and info.value.may_have_been_billed


@pytest.mark.parametrize("name", RETRYING_ROUTES)
@pytest.mark.parametrize("error", NEVER_SENT)
def test_retrying_routes_retry_errors_before_sending(
    service: FakeService, name: str, error: type[httpx.TransportError]
) -> None:
    with pytest.raises(ServiceUnreachableError) as info:
        ROUTES[name](service.reply(Reply(error=error)).client())
    assert len(service.requests) == 4
    assert service.delays == [3, 8, 15]
    assert not info.value.may_have_been_billed


@pytest.mark.parametrize("name", RETRYING_ROUTES)
def test_retrying_routes_recover_after_a_connection_failure(service: FakeService, name: str) -> None:
    result = ROUTES[name](service.reply(Reply(error=httpx.ConnectError), ROUTES[name].ok).client())
    assert result.attempts == 2
    assert service.delays == [3]


@pytest.mark.parametrize("name", RETRYING_ROUTES)
def test_an_unanswered_retry_ends_the_request(service: FakeService, name: str) -> None:
    """A 503 is retried; the retry that then gets no answer is not: the request is unknown."""
    service.reply(Reply(503), Reply(error=httpx.ReadTimeout), ROUTES[name].ok)
    with pytest.raises(OutcomeUnknownError) as info:
        ROUTES[name](service.client())
    assert len(service.requests) == 2 and service.delays == [3]
    assert info.value.attempts == 2


def test_an_unanswered_attempt_says_why_it_is_not_resent(
    service: FakeService, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="imagebatch.gateway"), pytest.raises(OutcomeUnknownError):
        ROUTES["images_generations"](service.reply(Reply(error=httpx.ReadTimeout)).client())
    (line,) = [r.getMessage() for r in caplog.records]
    assert "attempt 1: no answer from the service (ReadTimeout)" in line
    assert "not resent automatically" in line and "retrying" not in line


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
@pytest.mark.parametrize("error", SENT_NO_ANSWER)
def test_native_and_chat_no_answer_is_outcome_unknown(
    service: FakeService, name: str, error: type[httpx.RequestError]
) -> None:
    with pytest.raises(OutcomeUnknownError, match="billed") as info:
        ROUTES[name](service.reply(Reply(error=error), ROUTES[name].ok).client())
    assert len(service.requests) == 1
    assert service.delays == []
    assert info.value.attempts == 1


@pytest.mark.parametrize("name", SINGLE_ATTEMPT_ROUTES)
@pytest.mark.parametrize("error", NEVER_SENT)
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
        Reply(error=httpx.ConnectError),
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
        (2, None, "not_sent", None, 8),
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
