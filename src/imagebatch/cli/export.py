"""`imagebatch export`: a run's images written to DEST as deliverables, named by a template; the choices
behind each default are in `delivery/export.py` and `delivery/convert.py`. The summary goes to stdout, the
warnings and every refusal to stderr. Its flags are derived from
`delivery.options.ExportOptions` (one flag per field, its type, choices and help from the field); a
flag's default is None, meaning the model's default, so that a default is written in the model alone."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
import typing
from collections.abc import Iterator
from types import FrameType
from typing import Any

from pydantic import ValidationError

from imagebatch.cli.common import OUT_HELP, command
from imagebatch.cli.flags import help_of
from imagebatch.delivery.options import ExportOptions, flag_info, flag_of, from_given
from imagebatch.delivery.options import problem as refusal
from imagebatch.run.exit_codes import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE
from imagebatch.storage.location import shown_url


def add_export(sub: Any) -> None:
    parser = command(sub, "export", "write a run's images to DEST as deliverables, named by a template")
    parser.add_argument("out", help=OUT_HELP)
    parser.add_argument(
        "--to", required=True, metavar="DEST", help="the folder (or s3://bucket/prefix) to fill"
    )
    for name, info in ExportOptions.model_fields.items():
        kind = typing.get_args(info.annotation) or (info.annotation,)
        keywords: dict[str, Any]
        if bool in kind:
            keywords = {"action": argparse.BooleanOptionalAction}
        elif typing.get_origin(kind[0]) is typing.Literal:
            keywords = {"choices": typing.get_args(kind[0])}
        else:
            keywords = {"type": kind[0], "metavar": flag_info(info).metavar}
        text = help_of(info).replace("%", "%%")
        parser.add_argument(flag_of(name), dest=name, default=None, help=text, **keywords)
    parser.set_defaults(handler=export_command)


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


def export_command(args: argparse.Namespace) -> int:
    """`imagebatch export`, its options made into an export (`delivery.export.export`): the summary on
    stdout; every problem on stderr (the rows named), exit 2 and nothing written; 1 if a read or write
    failed midway (what was written is whole; rerun it). The export's modules are loaded here, not with
    the parser, so that `imagebatch --help` stays quick."""
    from imagebatch.delivery.export import export
    from imagebatch.delivery.exportplan import ExportRefused
    from imagebatch.delivery.naming import TemplateError
    from imagebatch.storage.bounded import RecordError

    try:
        options = from_given({name: getattr(args, name) for name in ExportOptions.model_fields})
    except ValidationError as exc:
        print(f"imagebatch export: {refusal(exc)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with _sigterm_as_interrupt():
            summary = export(args.out, args.to, options, progress=Ticker())
    except (TemplateError, RecordError) as exc:  # a record (or DEST's file) not a file, or over its bound
        print(f"imagebatch export: {exc}", file=sys.stderr)
        return EXIT_USAGE
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
        return EXIT_USAGE
    except OSError as exc:
        print(
            f"imagebatch export: stopped: {exc}; the files written are whole: rerun to finish",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    except KeyboardInterrupt as exc:  # the conversions in progress finished, the staging folder removed
        how, code = (
            ("SIGTERM", EXIT_TERMINATED) if isinstance(exc, Terminated) else ("Ctrl-C", EXIT_INTERRUPTED)
        )
        print(
            f"imagebatch export: stopped ({how}); the files written are whole: rerun to finish",
            file=sys.stderr,
        )
        return code
    print("\n".join(summary.lines()))
    for warning in summary.warnings():
        print(warning, file=sys.stderr)
    return EXIT_OK
