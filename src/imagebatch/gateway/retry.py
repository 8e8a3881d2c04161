"""The retry policy of each route, in one place.

From the spec and the design: the images routes and the text relay routes retry transport errors and the
statuses 408, 409, 425, 429 and 5xx after 3 s, 8 s and 15 s (four attempts at most), and never retry
400, 401, 402 or 404. The native route makes a single attempt (the spec disables automatic retries there);
the chat route makes a single attempt too, since it generates billed images the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from .constants import RETRY_DELAYS, RETRYABLE_STATUSES, Route


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

    def delay_before_retry(self, attempt: int, status: int | None) -> float | None:
        """The wait before attempt `attempt + 1`, or None to stop.

        `attempt` counts from 1; `status` is None for a transport error (no answer).
        """
        if attempt >= self.max_attempts:
            return None
        if status is not None and not is_retryable_status(status):
            return None
        return self.delays[attempt - 1]


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
