"""The `imagebatch` command: its parser (`build_parser`, every subcommand's, from the modules of `cli/`)
and `main`, the entry point. The parser imports neither Prefect nor the handlers, so that
`imagebatch --help` stays quick, and `main` builds only the named command's parser, so that a command's
start imports no other command's module; a run's options are the options model's flags (`cli.flags`).

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
from typing import Any

from imagebatch import __version__
from imagebatch.cli.common import TOP_EXIT_CODES, Parser, one_voice
from imagebatch.errors import UsageError
from imagebatch.extras import MissingExtra
from imagebatch.run.exit_codes import EXIT_USAGE, code_of, exit_code_for

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS = (
    "init",
    "run",
    "validate",
    "emulator",
    "report",
    "review",
    "export",
    "deploy",
    "serve",
    "limits",
    "worker",
)
"""The commands, in the order the help lists them (each one's parser: `_add_command`)."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand (the one a docs generator reads too), or of `command`'s alone: what
    `main` parses a command's arguments with, so that a command imports no other command's module (the
    emulator's settings, the export's image conversion, the Prefect commands')."""
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
    for name in COMMANDS if command is None else (command,):
        _add_command(sub, name)
    return one_voice(parser)


def _add_command(sub: Any, name: str) -> None:
    """Add command `name`'s parser (`cli/<module>.add_<name>`), its module imported only now."""
    if name == "init":
        from imagebatch.cli.init import add_init

        add_init(sub)
    elif name == "run":
        from imagebatch.cli.run import add_run

        add_run(sub)
    elif name == "validate":
        from imagebatch.cli.validate import add_validate

        add_validate(sub)
    elif name == "emulator":
        from imagebatch.cli.emulator import add_emulator

        add_emulator(sub)
    elif name in ("report", "review"):
        from imagebatch.cli.outputs import add_report, add_review

        (add_report if name == "report" else add_review)(sub)
    elif name == "export":
        from imagebatch.cli.export import add_export

        add_export(sub)
    elif name in ("deploy", "serve"):
        from imagebatch.cli.deploy import add_deploy, add_serve

        (add_deploy if name == "deploy" else add_serve)(sub)
    elif name in ("limits", "worker"):
        from imagebatch.cli.prefect_commands import add_limits, add_worker

        (add_limits if name == "limits" else add_worker)(sub)
    else:
        raise ValueError(f"no command {name!r}")


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
    given = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(given[0] if given and given[0] in COMMANDS else None)
    args = parser.parse_args(given)
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
