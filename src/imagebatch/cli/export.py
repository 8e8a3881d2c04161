"""`imagebatch export`: a run's images written to DEST as deliverables, named by a template; the choices
behind each default are in `delivery/export.py` and `delivery/convert.py`."""

from __future__ import annotations

import argparse
from typing import Any

from imagebatch.cli.common import OUT_HELP, command
from imagebatch.delivery.naming import DEFAULT_TEMPLATE


def add_export(sub: Any) -> None:
    parser = command(sub, "export", "write a run's images to DEST as deliverables, named by a template")
    parser.add_argument("out", help=OUT_HELP)
    parser.add_argument(
        "--to", required=True, metavar="DEST", help="the folder (or s3://bucket/prefix) to fill"
    )
    parser.add_argument(
        "--name",
        default=None,
        metavar="TEMPLATE",
        help="each file's path in DEST over results.csv's columns and {variant} {n} {ext} {key12}, e.g. "
        f"'{{sku}}/{{colour}}.{{ext}}' (default: '{DEFAULT_TEMPLATE}')",
    )
    parser.add_argument(
        "--approved-only",
        action="store_true",
        help="only images whose last review decision is approved (default: every succeeded image)",
    )
    _image_arguments(parser)
    parser.add_argument(
        "--slug", action="store_true", help="clean names: each value lower-case, spaces (and '/') to '-'"
    )
    parser.add_argument(
        "--prune",
        action="store_true",
        help="remove an earlier export's files this one does not deliver (default: move them to "
        "DEST/.superseded/DATE/); one changed since export wrote it is moved there all the same",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a file in DEST with other bytes that no earlier export wrote, keeping it in "
        "DEST/.superseded/DATE/ (default: refuse)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="images converted at once (default: every core)",
    )
    parser.set_defaults(handler=export_command)


def _image_arguments(parser: argparse.ArgumentParser) -> None:
    """What each deliverable is made as: its format, size, quality and background."""
    parser.add_argument(
        "--format",
        choices=("png", "jpeg", "webp"),
        default=None,
        help="the deliverables' format (default: each image's own)",
    )
    parser.add_argument(
        "--max-side",
        type=int,
        default=None,
        metavar="N",
        help="shrink images longer than N px (never enlarged)",
    )
    parser.add_argument(
        "--quality", type=int, default=None, metavar="Q", help="JPEG/WebP quality 1-100 (default 90)"
    )
    parser.add_argument(
        "--background",
        default="white",
        metavar="COLOR",
        help="what transparency is flattened onto for JPEG, and --canvas's colour: a name, #rrggbb or "
        "rgb(r,g,b) (default white)",
    )
    parser.add_argument(
        "--canvas",
        default=None,
        metavar="WxH",
        help="every image exactly W x H px: shrunk to fit if larger (never enlarged), centred on "
        "--background (at most 100 megapixels)",
    )


def export_command(args: argparse.Namespace) -> int:
    from imagebatch.delivery.command import export_main

    return export_main(args)
