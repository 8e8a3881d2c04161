"""`imagebatch limits`: create or update the account-wide limits (a Prefect global concurrency limit and its
rate limit) that runs take with `--global-limit`; `run.limits` holds them while a run sends."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from imagebatch.errors import UsageError
from imagebatch.platform.deploy import require_prefect_server
from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE
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


def limits_main(args: argparse.Namespace) -> int:
    """`imagebatch limits`: create or update the account-wide limits on the configured Prefect server."""
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
