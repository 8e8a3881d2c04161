"""The account-wide limit: one service account is shared by every run and every machine, so each request
takes a slot of a Prefect global concurrency limit while it is on the wire (never while it waits out a
retry's backoff), and, when one is set, a slot of a rate limit (requests a minute, through Prefect's slot
decay). Prefect's server keeps the count for every run, every worker and every machine.

    imagebatch limits --concurrency 8 [--per-minute 120] [--name imagebatch-requests]
    imagebatch run ... --global-limit imagebatch-requests      (or a deployment's `global_limit`)

`NAME` is the concurrency limit; `NAME-per-minute` the rate limit (limit M, decaying M/60 slots a second:
bursts of up to M, then M a minute). Without `--global-limit` a run's own `--concurrency` is its only limit,
as on Prefect's temporary server, which holds no limits.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from imagebatch.flows.config import UsageError
from imagebatch.flows.exits import EXIT_OK, EXIT_USAGE

DEFAULT_LIMIT = "imagebatch-requests"
LEASE_SECONDS = 300
"""A slot's lease, renewed by Prefect while the request runs; a killed run's slots come back after it."""


def rate_limit_name(name: str) -> str:
    return f"{name}-per-minute"


def request_slot(name: str) -> Callable[[], AbstractContextManager[object]]:
    """The slot each attempt holds on the wire (`GatewayClient(slot=...)`): `name`'s, and a slot of
    `NAME-per-minute` first when that rate limit exists. Refuses a limit the server does not have (a run
    would otherwise go unlimited without a word)."""
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency, rate_limit
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            raise UsageError(
                f"Prefect's server has no global concurrency limit {name!r}: create it with "
                f"`imagebatch limits --name {name} --concurrency N` (a temporary server holds none)"
            ) from None
        try:
            client.read_global_concurrency_limit_by_name(rate_limit_name(name))
            rate: str | None = rate_limit_name(name)
        except ObjectNotFound:
            rate = None

    @contextmanager
    def slot() -> Iterator[None]:
        if rate is not None:
            rate_limit(rate, strict=True)
        with concurrency(name, lease_duration=LEASE_SECONDS, strict=True):
            yield

    return slot


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


def limits_main(args: argparse.Namespace) -> int:
    """`imagebatch limits`: create or update the account-wide limits on the configured Prefect server."""
    from imagebatch.flows.deploy import require_prefect_server

    try:
        if args.concurrency < 1:
            raise UsageError(f"--concurrency must be at least 1, not {args.concurrency}")
        if args.per_minute is not None and args.per_minute < 0:
            raise UsageError(f"--per-minute must be 0 (remove) or more, not {args.per_minute}")
        api_url = require_prefect_server()
    except UsageError as exc:
        print(f"imagebatch limits: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for limit in set_limits(args.name, args.concurrency, args.per_minute):
        decay = limit["slot_decay_per_second"]
        what = f"{limit['limit']} a minute" if decay else f"{limit['limit']} requests on the wire at once"
        print(f"{limit['name']}: {what} (on {api_url})")
    print(f"runs take it with --global-limit {args.name} (deploy and serve too)")
    return EXIT_OK


def limits_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=DEFAULT_LIMIT, help=f"the limit's name (default: {DEFAULT_LIMIT})")
    parser.add_argument(
        "--concurrency",
        type=int,
        required=True,
        help="requests on the wire at once, over every run and machine",
    )
    parser.add_argument(
        "--per-minute",
        type=int,
        default=None,
        help="also at most this many requests a minute (NAME-per-minute; 0 removes it)",
    )
