"""`imagebatch validate`: a manifest's problems or its plan; with --out, what a run into OUT would send
now; with --prices, the most it can cost. Sends nothing."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TextIO

from imagebatch.cli.common import MANIFEST_HELP, command, sheet_argument
from imagebatch.cli.flags import add_option_flags, options_from
from imagebatch.manifest.formats import FORMAT_NAMES
from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE, code_of

if TYPE_CHECKING:
    from imagebatch.manifest import Manifest


def add_validate(sub: Any) -> None:
    parser = command(sub, "validate", "check a manifest and print its plan; sends nothing")
    parser.add_argument("manifest", help=MANIFEST_HELP)
    sheet_argument(parser)
    parser.add_argument(
        "--format",
        choices=FORMAT_NAMES,
        default=None,
        help="the manifest's format (default: from its extension)",
    )
    parser.add_argument(
        "--keys",
        action="store_true",
        help="also list every planned request with its idempotency key (with --out: and its state)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="an output folder or s3://bucket/prefix: also say what a run into it would send now (done, "
        "new, changed, unknown, rejected), reading it only",
    )
    add_option_flags(
        parser,
        "validate",
        only=("prices", "retry_unknown", "files_root", "redo", "edit"),
        helps={
            "prices": "price table: also print the most the manifest (with --out: the run) can cost, "
            "by model",
            "retry_unknown": "with --out: count what `run --retry-unknown` would send",
            "redo": "with --out: what `run --redo KINDS` would send (new variants, edits) and, with "
            "--prices, cost",
            "edit": "with --redo: as `run --redo rejected --edit`",
        },
    )
    parser.add_argument(
        "--name",
        default=None,
        metavar="TEMPLATE",
        help="check every row's deliverable name as `export --name TEMPLATE` would make it (unsafe "
        "characters, a '/' in a value, empty or space-padded parts, collisions)",
    )
    parser.add_argument("--slug", action="store_true", help="with --name: as `export --slug` makes them")
    parser.set_defaults(handler=validate_command)


def validate_command(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """The manifest's problems or its plan on `out` (standard output by default: the command's report,
    meant to be read, piped or grepped); with --out, what a run into OUT would send now (`work.forecast`);
    with --prices, the most that (or the whole manifest) can cost. No request is sent, no key needed."""
    from imagebatch.manifest import ManifestError, load_manifest, summarise_manifest
    from imagebatch.manifest.validate import plan_lines, problem_lines, summary_lines

    out = out if out is not None else sys.stdout
    if args.redo is not None and args.out is None:
        print(
            "imagebatch validate: --redo needs --out OUT, the output whose results it redoes", file=sys.stderr
        )
        return EXIT_USAGE
    # Only --keys, --name, --out and --prices look at the jobs themselves: without them, the manifest is
    # checked as a run checks it, and its plan counted row by row, with no job kept.
    counted = not (args.keys or args.name is not None or args.out is not None or args.prices)
    try:
        if counted:
            summary = summarise_manifest(args.manifest, format=args.format, files_root=args.files_root)
        else:
            manifest = load_manifest(args.manifest, format=args.format, files_root=args.files_root)
    except ManifestError as exc:
        print("\n".join(problem_lines(args.manifest, exc)), file=out)
        return code_of(exc)
    if counted:
        print("\n".join(summary_lines(args.manifest, summary)), file=out)
        return EXIT_OK
    print("\n".join(plan_lines(args.manifest, manifest, keys=args.keys and args.out is None)), file=out)
    if args.name is not None and not _names_checked(manifest, args.name, slugged=args.slug, out=out):
        return EXIT_USAGE
    if args.out is not None:
        return _forecast(manifest, args, out)
    if args.prices:
        return _estimate(manifest, args.prices, out)
    return EXIT_OK


def _names_checked(manifest: Manifest, text: str, *, slugged: bool, out: TextIO) -> bool:
    """`validate --name`: each problem on its own line, then one line of counts; False when a name would be
    refused (exit 2, as for a manifest's problems)."""
    from imagebatch.delivery.manifestnames import ASSUMED_EXT, name_problems
    from imagebatch.delivery.naming import TemplateError

    try:
        checked, problems = name_problems(manifest, text, slugged=slugged)
    except TemplateError as exc:
        print(exc, file=out)
        return False
    for problem in problems:
        print(problem, file=out)
    if problems:
        n = len(problems)
        print(f"--name {text!r}: {n} problem{'s' if n != 1 else ''}; nothing was sent", file=out)
        return False
    print(
        f"--name {text!r}: {checked} names, each safe and unique ({{ext}} taken as {ASSUMED_EXT})", file=out
    )
    return True


def _estimate(manifest: Manifest, prices: str, out: TextIO) -> int:
    """`validate --prices`: the most the manifest can cost, by model (images at most x price)."""
    from imagebatch.manifest import plan
    from imagebatch.work.prices import PriceError, PriceTable, estimate_lines

    try:
        table = PriceTable.load(prices)
    except PriceError as exc:
        print(f"imagebatch validate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print("\nmost it can cost (images at most x price):", file=out)
    print("\n".join(estimate_lines(plan(manifest), table)), file=out)
    return EXIT_OK


def _forecast(manifest: Manifest, args: argparse.Namespace, out: TextIO) -> int:
    """`validate --out OUT`: what a run into OUT would do now (read only: no lock taken, nothing written;
    a folder that does not exist is not made)."""
    from imagebatch.errors import UsageError
    from imagebatch.run.preflight import (
        check_output,
        check_redo,
        output_location,
    )
    from imagebatch.work.forecast import forecast, print_forecast
    from imagebatch.work.prices import PriceError, PriceTable
    from imagebatch.work.redo import redo_kinds
    from imagebatch.work.store import OutputStore

    where = output_location(args.out)
    try:
        options = options_from(args, "validate")
        check_redo(options)
        resend = options.resend
        table = PriceTable.load(args.prices) if args.prices else None
        if isinstance(where, str):
            check_output(where, lock=False)
        elif where.exists() and not where.is_dir():
            raise UsageError(f"--out {where} is a file, not a folder")
        elif where.exists():
            OutputStore(where).read_run()  # refused as a run into it would refuse it (one line, exit 2)
        result = forecast(
            manifest,
            where,
            retry_unknown=bool(args.retry_unknown),
            redo=redo_kinds(resend.redo),
            edit=resend.edit,
        )
    except (UsageError, PriceError, OSError) as exc:
        print(f"imagebatch validate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print_forecast(result, out, keys=args.keys, prices=table)
    return EXIT_OK
