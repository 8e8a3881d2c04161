"""`imagebatch export`, the command: its options made into an export (`delivery.export.export`), the
summary on stdout, the warnings and every refusal on stderr, and its exit code."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

from pydantic import ValidationError

from imagebatch.delivery.export import export
from imagebatch.delivery.exportplan import ExportRefused
from imagebatch.delivery.naming import TemplateError
from imagebatch.delivery.options import ExportOptions, from_given
from imagebatch.delivery.options import problem as refusal
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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so that it unwinds the same way: the
    conversions in progress finish, the staging folder is removed, DEST's lock is let go."""


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the main thread for the block (once: a second one while it
    unwinds is ignored, so the clean-up is not cut short); the earlier handler back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    earlier = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, earlier)


def export_main(args: argparse.Namespace) -> int:
    """`imagebatch export`: the summary on stdout; every problem on stderr (the rows named), exit 2 and
    nothing written; 1 if a read or write failed midway (what was written is whole; rerun it)."""
    try:
        options = from_given({name: getattr(args, name) for name in ExportOptions.model_fields})
    except ValidationError as exc:
        print(f"imagebatch export: {refusal(exc)}", file=sys.stderr)
        return 2
    try:
        with _sigterm_as_interrupt():
            summary = export(args.out, args.to, options, progress=Ticker())
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
    except KeyboardInterrupt as exc:  # the conversions in progress finished, the staging folder removed
        how, code = ("SIGTERM", 143) if isinstance(exc, Terminated) else ("Ctrl-C", 130)
        print(
            f"imagebatch export: stopped ({how}); the files written are whole: rerun to finish",
            file=sys.stderr,
        )
        return code
    print("\n".join(summary.lines()))
    for warning in summary.warnings():
        print(warning, file=sys.stderr)
    return 0
