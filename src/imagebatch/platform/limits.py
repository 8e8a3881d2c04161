"""The account-wide limits (a Prefect global concurrency limit and its rate limit) that runs take with
`--global-limit`, created or updated (`imagebatch limits`); `run.limits` holds them while a run sends."""

from __future__ import annotations

from typing import Any

from imagebatch.run.limits import rate_limit_name


def set_limits(name: str, concurrency: int, per_minute: int | None) -> list[dict[str, Any]]:
    """Create or update `name` (at most `concurrency` requests on the wire) and, with `per_minute`, the rate
    limit `NAME-per-minute` (0 removes it). Returns the limits as the server now holds them."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    rate = rate_limit_name(name)
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, concurrency)
        if per_minute:
            client.upsert_global_concurrency_limit_by_name(
                rate, per_minute, slot_decay_per_second=per_minute / 60
            )
        elif per_minute == 0:
            try:
                client.delete_global_concurrency_limit_by_name(rate)
            except ObjectNotFound:
                pass
        held = []
        for limit_name in (name, rate):
            try:
                limit = client.read_global_concurrency_limit_by_name(limit_name)
            except ObjectNotFound:
                continue
            held.append(
                {
                    "name": limit.name,
                    "limit": limit.limit,
                    "slot_decay_per_second": limit.slot_decay_per_second,
                }
            )
    return held
