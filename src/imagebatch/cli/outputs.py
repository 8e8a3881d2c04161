"""`imagebatch report` and `imagebatch review`: an output location's contact sheet, built, copied out of
a bucket, or served (on 127.0.0.1, or to named reviewers beyond it) to approve or reject each image."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from imagebatch.cli.common import OUT_HELP, command
from imagebatch.gateway.constants import ENV_REVIEWER
from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE
from imagebatch.storage.layout import REPORT_HTML, RESULTS_CSV

ENV_REVIEWERS = "IMAGEBATCH_REVIEWERS"
"""The reviewers file `review --reviewers` reads when the option is not given."""
REPORT_EVERY = 15.0
"""`review --report-every`'s default (`report.review_report.REPORT_INTERVAL`)."""


def add_report(sub: Any) -> None:
    parser = command(sub, "report", f"(re)build the contact sheet {REPORT_HTML} of an output folder")
    parser.add_argument("out", help=OUT_HELP)
    parser.add_argument(
        "--to",
        default=None,
        metavar="DIR",
        help="for a run in a bucket: copy its report, thumbnails, images and results.csv into DIR (writing "
        "nothing to the bucket) and print the page to open",
    )
    parser.set_defaults(handler=lambda args: report_command(args.out, args.to))


def add_review(sub: Any) -> None:
    parser = command(
        sub,
        "review",
        "serve the contact sheet on 127.0.0.1 to approve or reject each image",
        "Until Ctrl-C. Beyond loopback (--host), only for the reviewers a file names, each signing in with "
        "their own token (docs: review-and-delivery.md, several reviewers).",
    )
    parser.add_argument("out", help=OUT_HELP)
    parser.add_argument(
        "--port", type=int, default=0, help="port to listen on (default 0: a free one, printed)"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address to listen on; any but 127.0.0.1, ::1 or localhost needs --reviewers "
        "(default: 127.0.0.1)",
    )
    parser.add_argument(
        "--reviewers",
        default=None,
        metavar="FILE",
        help=f"a file of NAME TOKEN lines, readable by you only: every request then needs a reviewer's token "
        f"and decisions carry their name (default: ${ENV_REVIEWERS}, else none)",
    )
    parser.add_argument(
        "--origin",
        action="append",
        default=[],
        metavar="URL",
        help="an address browsers reach the server at besides --host (a TLS proxy's https://NAME), "
        "accepted as Host and Origin; repeatable (default: none)",
    )
    parser.add_argument(
        "--report-every",
        type=float,
        default=REPORT_EVERY,
        metavar="SECONDS",
        help=f"rebuild {REPORT_HTML} this often while decisions change (default: {REPORT_EVERY:g})",
    )
    parser.add_argument(
        "--reviewer",
        default=None,
        help=f"the name decisions are recorded under (default: ${ENV_REVIEWER}, else the login name)",
    )
    parser.add_argument(
        "--show", default=None, help="the manifest's columns each card shows, e.g. sku,colour (default: all)"
    )
    parser.add_argument("--group-by", default=None, help="a column whose equal values sit together, e.g. sku")
    parser.set_defaults(handler=review_command)


def report_command(out: str, to: str | None = None) -> int:
    """A local folder, or an object store's `s3://bucket/prefix` (the report is built from its records and
    thumbnails, fetched, and uploaded next to them). `to`: a bucket's report copied into that folder
    instead, nothing written to the bucket (`report.download`)."""
    from imagebatch.errors import UsageError
    from imagebatch.run.preflight import check_output, output_location
    from imagebatch.work.store import OutputStore

    where = output_location(out)
    if to is not None and not isinstance(where, str):
        why = f"--to copies a report out of a bucket; {out}/{REPORT_HTML} opens where it is"
        print(f"imagebatch report: {why}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if isinstance(where, str):
            check_output(where, lock=False)
        store = OutputStore(where)
        if not store.backend.exists(RESULTS_CSV):
            why = f"has no {RESULTS_CSV} (not an output folder of a finished run)"
            print(f"imagebatch report: {store.where} {why}", file=sys.stderr)
            return EXIT_USAGE
        if to is None and store.settle_dead_run(datetime.now(UTC).isoformat()) is not None:
            print(f"imagebatch report: the last run into {store.where} died running; run.json says so now")
        print(_download(store, to) if to is not None else _build(store))
    except (UsageError, OSError) as exc:
        print(f"imagebatch report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _build(store: Any) -> Any:
    from imagebatch.report.location import write_report

    return write_report(store)


def _download(store: Any, to: str) -> Path:
    from imagebatch.report.download import download_report
    from imagebatch.storage.bucket import BucketBackend

    assert isinstance(store.backend, BucketBackend)  # --to is refused for a folder before
    return download_report(store.backend, Path(to).expanduser()).resolve()


def review_command(args: argparse.Namespace) -> int:
    """A local folder, or a bucket's `s3://bucket/prefix` (checked first, as for `report`); serves until
    Ctrl-C (`report.review`)."""
    from imagebatch.errors import UsageError
    from imagebatch.report.review import ReviewError, default_reviewer, serve_review
    from imagebatch.run.preflight import check_output, output_location
    from imagebatch.storage.bounded import RecordError
    from imagebatch.storage.kinds import open_location

    where = output_location(args.out)
    try:
        if isinstance(where, str):
            check_output(where, lock=False)
        location = open_location(where)
    except (UsageError, OSError) as exc:
        print(f"imagebatch review: {exc}", file=sys.stderr)
        return EXIT_USAGE
    show = [c.strip() for c in args.show.split(",") if c.strip()] if args.show is not None else None
    settings = _team(args, where)
    if settings is None:
        return EXIT_USAGE
    try:
        serve_review(
            location,
            default_reviewer(args.reviewer),
            args.port,
            show=show,
            group_by=args.group_by,
            **settings,
        )
    except (ReviewError, RecordError) as exc:
        print(f"imagebatch review: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _team(args: argparse.Namespace, where: Any) -> dict[str, Any] | None:
    """`serve_review`'s host, reviewers, origins and report rebuild from the options; None (said in one
    line) for a reviewers file that cannot be read, an --origin that is not an address or a bad period."""
    from imagebatch.report.review_auth import load_reviewers
    from imagebatch.report.review_data import ReviewError

    path = args.reviewers or os.environ.get(ENV_REVIEWERS) or None
    bad = [o for o in args.origin if urlsplit(o).scheme not in ("http", "https") or not urlsplit(o).netloc]
    try:
        if bad:
            raise ReviewError(f"--origin {bad[0]} is not an address such as https://review.example.com")
        if not args.report_every > 0:
            raise ReviewError(f"--report-every must be a number of seconds above 0, not {args.report_every}")
        reviewers = load_reviewers(path) if path else None
    except ReviewError as exc:
        print(f"imagebatch review: {exc}", file=sys.stderr)
        return None
    return {
        "host": args.host,
        "reviewers": reviewers,
        "origins": args.origin,
        "rebuild": lambda: _build(_store(where)),
        "report_interval": args.report_every,
    }


def _store(where: Any) -> Any:
    from imagebatch.work.store import OutputStore

    return OutputStore(where)
