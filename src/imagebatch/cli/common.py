"""What the commands' parsers share: the manifest argument, the exit codes every help page ends with, and
a subcommand's parser made with its help as the description a user reads."""

from __future__ import annotations

import argparse
from typing import Any

EXIT_CODES = (
    "exit codes: 0 done (or valid), 1 some requests did not succeed, 2 an invalid manifest or a usage error "
    "(nothing sent), 130 stopped with Ctrl-C, 143 with SIGTERM"
)

MANIFEST_HELP = (
    "CSV, JSON, JSON Lines, XLSX (FILE.xlsx#SHEET for a sheet) or Parquet manifest; a CSV or JSON one may "
    "be an object's URL (s3://bucket/m.csv)"
)
OUT_HELP = "an output folder of `imagebatch run`, or its s3://bucket/prefix"


def command(sub: Any, name: str, summary: str, details: str = "") -> argparse.ArgumentParser:
    """A subcommand's parser: `summary` in `imagebatch --help`, `summary` and `details` atop its own
    help, the exit codes below it."""
    return sub.add_parser(
        name,
        help=summary,
        description=f"{summary[0].upper()}{summary[1:]}." + (f" {details}" if details else ""),
        epilog=EXIT_CODES,
    )


def sheet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sheet",
        default=None,
        metavar="NAME",
        help="the sheet of an .xlsx manifest (default: its first visible sheet); the same as FILE.xlsx#NAME",
    )
