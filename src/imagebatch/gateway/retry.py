"""The retry policy of each route, in one place.

From the spec and the design: the images routes and the text relay routes retry the statuses 408, 409,
425, 429 and 5xx after 3 s, 8 s and 15 s (four attempts at most), and never retry 400, 401, 402 or 404.
The native route makes a single attempt (the spec disables automatic retries there); the chat route makes
a single attempt too, since it generates billed images the same way.

Of the transport errors, only those raised before the request's bytes left this machine are retried on
the schedule (`was_never_sent`: connection refused, DNS, connect or pool timeout). An attempt that may
have reached the service and got no answer (a read or write timeout, a connection dropped or reset after
the request was written, a malformed answer) is never resent on any route: the spec (errors, case 2) asks
for its outcome to be confirmed first, since a resend can generate and bill it twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from .constants import RETRY_DELAYS, RETRYABLE_STATUSES, Route

NEVER_SENT: tuple[type[httpx.RequestError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
)
"""The httpx errors raised before any byte of the request was written: the TCP connection or its TLS
handshake failed or timed out (DNS included), no connection of the pool came free in time, the URL's
scheme has no transport, or the request could not be framed (h11 refuses its head before writing it).
Every other error of an attempt (`ReadTimeout`, `WriteTimeout`, `ReadError`, `WriteError`,
`RemoteProtocolError`, `DecodingError`, ...) may come after the service read the request."""


def was_never_sent(exc: httpx.RequestError) -> bool:
    """True when `exc` was raised before the request left this machine (it cannot have been billed)."""
    return isinstance(exc, NEVER_SENT)


def is_retryable_status(status: int) -> bool:
    """True for 408, 409, 425, 429 and every 5xx."""
    return status in RETRYABLE_STATUSES or 500 <= status <= 599


@dataclass(frozen=True)
class RetryPolicy:
    """When to try again and how long to wait first."""

    delays: tuple[float, ...]
    """Waits before the 2nd, 3rd, ... attempt; empty means a single attempt."""

    @property
    def max_attempts(self) -> int:
        return len(self.delays) + 1

    def delay_before_retry(
        self, attempt: int, status: int | None, retry_after: float | None = None
    ) -> float | None:
        """The wait before attempt `attempt + 1`, or None to stop.

        `attempt` counts from 1; `status` is the answer's, or None for an attempt that was never sent
        (`was_never_sent`). An attempt that may have been sent and got no answer has no retry at all
        (`delay_after_transport_error`). A `Retry-After`
        the service sent lengthens the wait, never shortens it below the spec's step (the spec sets the
        schedule; a service asking for more time gets it, up to `MAX_RETRY_AFTER`).
        """
        if attempt >= self.max_attempts:
            return None
        if status is not None and not is_retryable_status(status):
            return None
        step = self.delays[attempt - 1]
        if retry_after is None:
            return step
        return max(step, min(retry_after, MAX_RETRY_AFTER))

    def delay_after_transport_error(self, attempt: int, exc: httpx.RequestError) -> float | None:
        """The wait before attempt `attempt + 1` after an attempt that raised `exc`, or None to stop: the
        schedule's step when the request never left, and None, on every route, when it may have reached
        the service (its outcome is unknown until someone checks the service's usage history)."""
        if not was_never_sent(exc):
            return None
        return self.delay_before_retry(attempt, None)


MAX_RETRY_AFTER = 600.0
"""The longest `Retry-After` honoured (seconds): a service asking for more gets this (a run is not left
waiting for an hour on one request; the next run sends it)."""


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """`Retry-After` in seconds: delta-seconds or an HTTP date (RFC 9110); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


SINGLE_ATTEMPT = RetryPolicy(delays=())
SCHEDULED = RetryPolicy(delays=RETRY_DELAYS)

POLICIES: dict[Route, RetryPolicy] = {
    Route.NATIVE: SINGLE_ATTEMPT,
    Route.CHAT: SINGLE_ATTEMPT,
    Route.IMAGES_GENERATIONS: SCHEDULED,
    Route.IMAGES_EDITS: SCHEDULED,
    Route.MESSAGES: SCHEDULED,
    Route.RESPONSES: SCHEDULED,
}


def policy_for(route: Route) -> RetryPolicy:
    """The policy of `route`."""
    return POLICIES[route]
