"""`imagebatch export`: a run's images written to DEST as deliverables, named by a template; the choices
behind each default are in `delivery/export.py` and `delivery/convert.py`. Its flags are derived from
`delivery.options.ExportOptions` (one flag per field, its type, choices and help from the field); a
flag's default is None, meaning the model's default, so that a default is written in the model alone."""

from __future__ import annotations

import argparse
import typing
from typing import Any

from imagebatch.cli.common import OUT_HELP, command
from imagebatch.cli.flags import help_of
from imagebatch.delivery.options import ExportOptions, flag_info, flag_of


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


def export_command(args: argparse.Namespace) -> int:
    from imagebatch.delivery.command import export_main

    return export_main(args)
