"""The `imagebatch` command: its parser (`build_parser`, every subcommand's, from the modules of `cli/`)
and `main`, the entry point. The parser imports neither Prefect nor the handlers, so that
`imagebatch --help` stays quick; a run's options are the options model's flags (`cli.flags`).

argparse rather than Typer: it is in the standard library (nothing more to import at start-up, where
Prefect already costs seconds), and the flags of a run's options are derived from the model anyway.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from imagebatch import __version__
from imagebatch.cli.common import TOP_EXIT_CODES, Parser, one_voice
from imagebatch.cli.deploy import add_deploy, add_serve
from imagebatch.cli.emulator import add_emulator
from imagebatch.cli.export import add_export
from imagebatch.cli.init import add_init
from imagebatch.cli.outputs import add_report, add_review
from imagebatch.cli.prefect_commands import add_limits, add_worker
from imagebatch.cli.run import add_run
from imagebatch.cli.validate import add_validate
from imagebatch.errors import UsageError
from imagebatch.extras import MissingExtra
from imagebatch.run.exit_codes import EXIT_USAGE, code_of, exit_code_for

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (the one a docs generator reads too)."""
    parser = Parser(
        prog="imagebatch",
        description="Generate the images a manifest asks for through an image-generation gateway, as "
        "Prefect flows: check, run, review, export, deploy.",
        epilog=TOP_EXIT_CODES,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    add_init(sub)
    add_run(sub)
    add_validate(sub)
    add_emulator(sub)
    add_report(sub)
    add_review(sub)
    add_export(sub)
    add_deploy(sub)
    add_serve(sub)
    add_limits(sub)
    add_worker(sub)
    return one_voice(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """The command: a bare `imagebatch` prints the help on stdout and exits 2, as a usage error does.

    A reader that stops reading early (`imagebatch validate M.csv | head -3`) ends the command quietly,
    with the code of a process stopped by SIGPIPE (141), as `cat` or `grep` would end: no traceback."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # What is still buffered for stdout would raise again as Python exits: send it nowhere instead.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return exit_code_for(signal.SIGPIPE)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "sheet", None) is not None:
        if not _workbook(args.manifest, getattr(args, "format", None)):
            print(f"imagebatch {args.command}: --sheet is for an .xlsx manifest", file=sys.stderr)
            return EXIT_USAGE
        args.manifest = type(args.manifest)(f"{args.manifest}#{args.sheet}")  # what a reload reads again
    try:
        return int(args.handler(args))
    except (MissingExtra, UsageError) as exc:  # raised while the manifest or a location is checked
        print(f"imagebatch {args.command}: {exc}", file=sys.stderr)
        return code_of(exc)


def _workbook(manifest: str | Path, format: str | None) -> bool:
    return format == "xlsx" or (format is None and Path(manifest).suffix.lower() == ".xlsx")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
