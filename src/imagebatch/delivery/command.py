"""`imagebatch export`, the command: its options made into an export (`delivery.export.export`), the
summary on stdout, the warnings and every refusal on stderr, and its exit code."""

from __future__ import annotations

import argparse
import sys
import time

from imagebatch.delivery.convert import Conversion
from imagebatch.delivery.export import export
from imagebatch.delivery.exportplan import ExportRefused
from imagebatch.delivery.naming import TemplateError
from imagebatch.storage.bounded import RecordError
from imagebatch.storage.location import shown_url

SHOWN_PROBLEMS = 20


class Ticker:
    """`converted 1,200 of 10,000` on a terminal's stderr, rewritten at most every half second (nothing
    when stderr is not a terminal: a log or a pipe gets the summary only)."""

    def __init__(self) -> None:
        self.shown = 0.0
        self.on = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.on and (done == total or now - self.shown >= 0.5):
            self.shown = now
            end = "\n" if done == total else ""
            print(f"\rconverted {done:,} of {total:,}", end=end, file=sys.stderr, flush=True)


def export_main(args: argparse.Namespace) -> int:
    """`imagebatch export`: the summary on stdout; every problem on stderr (the rows named), exit 2 and
    nothing written; 1 if a read or write failed midway (what was written is whole; rerun it)."""
    try:
        conversion = Conversion.from_options(
            args.format, args.max_side, args.quality, args.background, args.canvas
        )
    except ValueError as exc:
        print(f"imagebatch export: {exc}", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 1:
        print(f"imagebatch export: --workers {args.workers}: 1 or more", file=sys.stderr)
        return 2
    try:
        summary = export(
            args.out,
            args.to,
            template=args.name,
            conversion=conversion,
            approved_only=args.approved_only,
            overwrite=args.overwrite,
            slug=args.slug,
            prune=args.prune,
            workers=args.workers,
            progress=Ticker(),
        )
    except (TemplateError, RecordError) as exc:  # a record (or DEST's file) not a file, or over its bound
        print(f"imagebatch export: {exc}", file=sys.stderr)
        return 2
    except ExportRefused as exc:
        for problem in exc.problems[:SHOWN_PROBLEMS]:
            print(problem, file=sys.stderr)
        if len(exc.problems) > SHOWN_PROBLEMS:
            print(f"... and {len(exc.problems) - SHOWN_PROBLEMS} more", file=sys.stderr)
        n = len(exc.problems)
        written = (
            "the files before it were written whole"
            if exc.written
            else f"nothing was written to {shown_url(args.to)}"
        )
        print(f"imagebatch export: {n} problem{'s' if n != 1 else ''}; {written}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"imagebatch export: stopped: {exc}; the files written are whole: rerun to finish",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:  # the conversions in progress finished, the staging folder removed
        print(
            "imagebatch export: stopped (Ctrl-C); the files written are whole: rerun to finish",
            file=sys.stderr,
        )
        return 130
    print("\n".join(summary.lines()))
    for warning in summary.warnings():
        print(warning, file=sys.stderr)
    return 0
