"""`imagebatch limits` and `imagebatch worker`: the account-wide limits on the Prefect server, and
Prefect's process worker stopped gracefully."""

from __future__ import annotations

import argparse
from typing import Any

from imagebatch.cli.common import command
from imagebatch.platform.worker import GRACE as WORKER_GRACE
from imagebatch.run.limits import DEFAULT_LIMIT


def add_limits(sub: Any) -> None:
    parser = command(sub, "limits", "create or update the account-wide limits on the Prefect server")
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
    parser.set_defaults(handler=limits_command)


def add_worker(sub: Any) -> None:
    parser = command(
        sub, "worker", "run `prefect worker start`; on SIGTERM, stop its flow runs gracefully first"
    )
    parser.add_argument("--pool", required=True, help="the process work pool to poll")
    parser.add_argument("--limit", type=int, default=None, help="the most flow runs at once (Prefect's)")
    parser.add_argument(
        "--grace",
        type=float,
        default=WORKER_GRACE,
        help="seconds the flow runs get to stop after a SIGTERM before the worker stops "
        f"(default {WORKER_GRACE:g})",
    )
    parser.add_argument(
        "extra", nargs=argparse.REMAINDER, help="after --: more options for `prefect worker start`"
    )
    parser.set_defaults(handler=worker_command)


def limits_command(args: argparse.Namespace) -> int:
    from imagebatch.platform.limits import limits_main

    return limits_main(args)


def worker_command(args: argparse.Namespace) -> int:
    from imagebatch.platform.worker import worker_main

    return worker_main(args)
