"""`imagebatch run`: its arguments (the options model's flags, `cli.flags`); the command itself is
`cli.terminal.run_main`."""

from __future__ import annotations

import argparse
from typing import Any

from imagebatch.cli.common import MANIFEST_HELP, command, sheet_argument
from imagebatch.cli.flags import add_option_flags


def add_run(sub: Any) -> None:
    parser = command(
        sub,
        "run",
        "generate everything a manifest asks for",
        "A rerun into the same --out sends only what is new, changed or not yet done.",
    )
    parser.add_argument("manifest", help=MANIFEST_HELP)
    sheet_argument(parser)
    parser.add_argument("--out", required=True, help="output folder (created; a rerun resumes from it)")
    add_option_flags(parser, "run")
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    from imagebatch.cli.terminal import run_main

    return run_main(args)
