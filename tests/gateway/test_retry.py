"""The retry policy table: which routes retry, which statuses, and how long to wait."""

from __future__ import annotations

import httpx
import pytest

from imagebatch.gateway.constants import Route
from imagebatch.gateway.retry import POLICIES, RetryPolicy, is_retryable_status, policy_for, was_never_sent

RETRYABLE = [408, 409, 425, 429, 500, 501, 502, 503, 504, 599]
NOT_RETRYABLE = [200, 301, 400, 401, 402, 403, 404, 413, 418, 422, 600]


@pytest.mark.parametrize("status", RETRYABLE)
def test_retryable_statuses(status: int) -> None:
    assert is_retryable_status(status)


@pytest.mark.parametrize("status", NOT_RETRYABLE)
def test_statuses_never_retried(status: int) -> None:
    assert not is_retryable_status(status)


@pytest.mark.parametrize(
    ("route", "delays"),
    [
        (Route.NATIVE, ()),
        (Route.CHAT, ()),
        (Route.IMAGES_GENERATIONS, (3, 8, 15)),
        (Route.IMAGES_EDITS, (3, 8, 15)),
        (Route.MESSAGES, (3, 8, 15)),
        (Route.RESPONSES, (3, 8, 15)),
    ],
)
def test_policy_of_each_route(route: Route, delays: tuple[float, ...]) -> None:
    policy = policy_for(route)
    assert policy.delays == delays
    assert policy.max_attempts == len(delays) + 1


def test_every_route_has_a_policy() -> None:
    assert set(POLICIES) == set(Route)


@pytest.mark.parametrize("status", [*RETRYABLE, None])
def test_scheduled_policy_waits_3_8_15_then_stops(status: int | None) -> None:
    policy = policy_for(Route.IMAGES_GENERATIONS)
    assert [policy.delay_before_retry(n, status) for n in (1, 2, 3, 4)] == [3, 8, 15, None]


@pytest.mark.parametrize("status", [400, 401, 402, 404])
def test_scheduled_policy_stops_on_client_errors(status: int) -> None:
    assert policy_for(Route.MESSAGES).delay_before_retry(1, status) is None


@pytest.mark.parametrize("route", [Route.NATIVE, Route.CHAT])
@pytest.mark.parametrize("status", [*RETRYABLE, None])
def test_single_attempt_routes_never_wait(route: Route, status: int | None) -> None:
    assert policy_for(route).delay_before_retry(1, status) is None


def test_custom_policy() -> None:
    policy = RetryPolicy(delays=(0.5,))
    assert policy.max_attempts == 2
    assert policy.delay_before_retry(1, 503) == 0.5
    assert policy.delay_before_retry(2, 503) is None


# === transport errors: before sending, or possibly after =================================================

REQUEST = httpx.Request("POST", "http://gateway.test/v1/images/generations")
BEFORE_SENDING = [
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
]
POSSIBLY_SENT = [
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.CloseError,
    httpx.RemoteProtocolError,
    httpx.ProxyError,
    httpx.DecodingError,
]


@pytest.mark.parametrize("error", BEFORE_SENDING)
def test_errors_before_sending_follow_the_schedule(error: type[httpx.RequestError]) -> None:
    exc = error("x", request=REQUEST)
    assert was_never_sent(exc)
    policy = policy_for(Route.IMAGES_EDITS)
    assert [policy.delay_after_transport_error(n, exc) for n in (1, 2, 3, 4)] == [3, 8, 15, None]


@pytest.mark.parametrize("route", list(Route))
@pytest.mark.parametrize("error", POSSIBLY_SENT)
def test_errors_that_may_follow_sending_are_never_retried(
    route: Route, error: type[httpx.RequestError]
) -> None:
    exc = error("x", request=REQUEST)
    assert not was_never_sent(exc)
    assert policy_for(route).delay_after_transport_error(1, exc) is None
