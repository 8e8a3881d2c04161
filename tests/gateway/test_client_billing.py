"""GatewayClient after a failure (against the shared fake service): whether a failed request may have been
billed (may a caller resend it on its own?), what is never sent, the key never shown, Retry-After, and the
account-wide slot held only on the wire. No real waiting: the client's `sleep` records its delays."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from helpers.fake_gateway import (
    ALL_ROUTES,
    KEY,
    RETRYING_ROUTES,
    ROUTES,
    SINGLE_ATTEMPT_ROUTES,
    FakeService,
    Reply,
    image_part,
    native_body,
)

from imagebatch.gateway import (
    AttemptFinished,
    GatewayClient,
)
from imagebatch.gateway.errors import (
    BadRequestError,
    ConfigurationError,
    GatewayError,
    OutcomeUnknownError,
    RateLimitError,
    ResponseFormatError,
    ServerError,
    ServiceUnreachableError,
)

NOT_AN_IMAGE = Reply(json=native_body(image_part(b"GIF89a not an image")))


# === may_have_been_billed: may a caller resend on its own? ===============================================


def status_reply(status: int) -> Reply:
    return Reply(status, json={"error": {"message": f"status {status}"}})


BILLED_CASES: list[tuple[str, str, list[Reply], type[GatewayError], bool, list[float]]] = [
    ("native no answer", "native", [Reply(error=httpx.ReadTimeout)], OutcomeUnknownError, True, []),
    ("native 500", "native", [status_reply(500)], ServerError, True, []),
    ("native 503", "native", [status_reply(503)], ServerError, False, []),
    ("native 429", "native", [status_reply(429)], RateLimitError, False, []),
    ("native 200 not json", "native", [Reply(content=b"<html>")], ResponseFormatError, True, []),
    (
        "native 200 bad image",
        "native",
        [NOT_AN_IMAGE],
        ResponseFormatError,
        True,
        [],
    ),
    ("native refused", "native", [Reply(error=httpx.ConnectError)], ServiceUnreachableError, False, []),
    (
        "images no answer",
        "images_generations",
        [Reply(error=httpx.ReadTimeout), status_reply(503)],
        OutcomeUnknownError,
        True,
        [],
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
        "images 503 then no answer",
        "images_generations",
        [status_reply(503), Reply(error=httpx.RemoteProtocolError), status_reply(503)],
        OutcomeUnknownError,
        True,
        [3],
    ),
    (
        "edits refused then 400",
        "images_edits",
        [Reply(error=httpx.ConnectError), status_reply(400)],
        BadRequestError,
        False,
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


# === Retry-After =========================================================================================


def too_many(retry_after: str) -> Reply:
    body = {"error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limit_exceeded"}}
    return Reply(429, json=body, headers={"retry-after": retry_after})


@pytest.mark.parametrize(
    ("retry_after", "waits"),
    [("20", [20.0]), ("1", [3.0]), ("0", [3.0]), ("86400", [600.0]), ("soon", [3.0])],
    ids=["longer-than-the-step", "shorter", "zero", "capped", "unreadable"],
)
@pytest.mark.parametrize("name", RETRYING_ROUTES)
def test_retry_after_lengthens_the_wait_never_below_the_step(
    service: FakeService, name: str, retry_after: str, waits: list[float]
) -> None:
    case = ROUTES[name]
    case(service.reply(too_many(retry_after), case.ok).client())
    assert service.delays == waits and len(service.requests) == 2


def test_retry_after_as_an_http_date() -> None:
    from datetime import UTC, datetime

    from imagebatch.gateway.retry import parse_retry_after

    now = datetime(2026, 11, 24, 3, 0, 0, tzinfo=UTC)
    assert parse_retry_after("Tue, 24 Nov 2026 03:00:45 GMT", now) == 45.0
    assert parse_retry_after("Tue, 24 Nov 2026 02:59:00 GMT", now) == 0.0


@pytest.mark.parametrize("name", SINGLE_ATTEMPT_ROUTES)
def test_a_429_on_the_single_attempt_routes_is_not_retried_whatever_retry_after_says(
    service: FakeService, name: str
) -> None:
    with pytest.raises(RateLimitError):
        ROUTES[name](service.reply(too_many("5")).client())
    assert len(service.requests) == 1 and service.delays == []


# === the account-wide slot ==============================================================================


@pytest.mark.parametrize("name", RETRYING_ROUTES)
def test_a_slot_is_held_on_the_wire_and_never_during_a_retry_wait(service: FakeService, name: str) -> None:
    @contextmanager
    def slot() -> Iterator[None]:
        service.log.append("slot taken")
        try:
            yield
        finally:
            service.log.append("slot given back")

    client = service.reply(Reply(503), Reply(429), ROUTES[name].ok).client(slot=slot)
    ROUTES[name](client)
    steps = [e if isinstance(e, str) else e[0] for e in service.log if isinstance(e, str | tuple)]
    assert steps == ["slot taken", "sent", "slot given back", "sleep"] * 2 + [
        "slot taken",
        "sent",
        "slot given back",
    ]


def test_a_slot_is_given_back_when_the_attempt_fails_for_good(service: FakeService) -> None:
    held: list[int] = []

    @contextmanager
    def slot() -> Iterator[None]:
        held.append(1)
        try:
            yield
        finally:
            held.pop()

    with pytest.raises(BadRequestError):
        ROUTES["native"](service.reply(Reply(400, json={"error": {"message": "no"}})).client(slot=slot))
    assert held == [] and len(service.requests) == 1
