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
        "--allow-out",
        action="append",
        metavar="ROOT",
        help="a folder or object store prefix its runs may write under (repeatable; sets "
        "IMAGEBATCH_ALLOWED_OUT; default: each run writes only to its deployment's own out)",
    )
    parser.add_argument(
        "--allow-base-url",
        action="append",
        metavar="URL",
        help="a service its runs may send its API key to (repeatable; `embedded` for the emulator; sets "
        "IMAGEBATCH_ALLOWED_BASE_URLS; default: only its deployment's own base URL)",
    )
    parser.add_argument(
        "extra", nargs=argparse.REMAINDER, help="after --: more options for `prefect worker start`"
    )
    parser.set_defaults(handler=worker_command)


def limits_command(args: argparse.Namespace) -> int:
    from imagebatch.platform.limits import limits_main

    return limits_main(args)


def worker_command(args: argparse.Namespace) -> int:
    """The worker, its allow-lists (`run.trust`) put in the environment its flow runs inherit."""
    import os
    import sys

    from imagebatch.platform.worker import worker_main
    from imagebatch.run.exit_codes import EXIT_USAGE
    from imagebatch.run.trust import ENV_ALLOWED_BASE_URLS, ENV_ALLOWED_OUT, check_entry

    lists = {
        ENV_ALLOWED_OUT: ("--allow-out", args.allow_out or []),
        ENV_ALLOWED_BASE_URLS: ("--allow-base-url", args.allow_base_url or []),
    }
    for variable, (flag, entries) in lists.items():
        for entry in entries:
            try:
                if "," in entry:
                    raise ValueError("one entry per flag, without a comma")
                check_entry(variable, entry)
            except ValueError as exc:
                print(f"imagebatch worker: {flag} {entry!r}: {exc}", file=sys.stderr)
                return EXIT_USAGE
        if entries:
            os.environ[variable] = ",".join(entries)  # what its flow runs inherit
    return worker_main(args)
