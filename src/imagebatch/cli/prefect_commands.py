"""`imagebatch limits` and `imagebatch worker`: the account-wide limits on the Prefect server, and
Prefect's process worker stopped gracefully."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from imagebatch.cli.common import command
from imagebatch.errors import UsageError
from imagebatch.platform.worker import GRACE as WORKER_GRACE
from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE, code_of, exit_code_for
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
    """`imagebatch limits`: create or update the account-wide limits on the configured Prefect server."""
    from imagebatch.platform.deploy import require_prefect_server
    from imagebatch.platform.limits import set_limits

    try:
        if args.concurrency < 1:
            raise UsageError(f"--concurrency must be at least 1, not {args.concurrency}")
        if args.per_minute is not None and args.per_minute < 0:
            raise UsageError(f"--per-minute must be 0 (remove) or more, not {args.per_minute}")
        api_url = require_prefect_server()
    except UsageError as exc:
        print(f"imagebatch limits: {exc}", file=sys.stderr)
        return code_of(exc)
    for limit in set_limits(args.name, args.concurrency, args.per_minute):
        decay = limit["slot_decay_per_second"]
        what = f"{limit['limit']} a minute" if decay else f"{limit['limit']} requests on the wire at once"
        print(f"{limit['name']}: {what} (on {api_url})")
    print(f"runs take it with --global-limit {args.name} (deploy and serve too)")
    return EXIT_OK


def worker_command(args: argparse.Namespace) -> int:
    """The worker, its allow-lists (`run.trust`) put in the environment its flow runs inherit; its own exit
    code, or 128 + the signal that stopped it."""
    from imagebatch.platform.worker import run_worker
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
    if args.grace < 0:
        print("imagebatch worker: --grace must be 0 or more", file=sys.stderr)
        return EXIT_USAGE
    end = run_worker(args.pool, args.limit, args.grace, [a for a in args.extra if a != "--"])
    if end.received is not None and end.returncode < 0:
        return exit_code_for(end.received)
    return end.returncode
