"""The `imagebatch` command: every subcommand, its options and its exit codes, in this one module.

    imagebatch validate MANIFEST [--out OUT] [--keys]     check a manifest, print its plan (and what a run
                                                          into OUT would send); sends nothing
    imagebatch run MANIFEST --out DIR [options]           generate everything it asks for (Prefect flow)
    imagebatch emulator [options]                         serve the emulated gateway on loopback
    imagebatch report OUT                                 (re)build OUT/report.html, the contact sheet
    imagebatch report s3://bucket/prefix --to DIR         copy a bucket's report into DIR, to open there
    imagebatch review OUT [--port P] [--reviewer NAME]    approve or reject each image in a browser
    imagebatch export OUT --to DEST [options]             the run's images as named deliverables
    imagebatch deploy MANIFEST --out DIR|URL --name NAME ...  a scheduled deployment on a Prefect server
    imagebatch serve MANIFEST --out DIR|URL --name NAME ...   the same, its runs served from this process
    imagebatch worker --pool POOL [...]                   Prefect's process worker, stopped gracefully

Exit codes (`imagebatch.run.exit_codes`): 0 done (or valid), 1 some requests did not succeed, 2 an invalid
manifest or a usage error (nothing sent), 130 stopped with Ctrl-C, 143 with SIGTERM.

argparse rather than Typer: it is in the standard library (no dependency and nothing more to import at
start-up, where Prefect already costs seconds), and the options are few and flat. The handlers live next
to what they drive (`terminal.run_main`, `emulator.serve.serve`, `manifest` validate, `deploy.deploy_main`);
the parser imports none of them (nor Prefect), so `imagebatch --help` stays quick.

Over 450 lines on purpose: every command's options are here (and only here) so that the help, the
defaults and the flow's parameters are read in one place; the handlers it dispatches to are elsewhere.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from imagebatch.delivery.naming import DEFAULT_TEMPLATE
from imagebatch.gateway.constants import ENV_API_KEY, ENV_BASE_URL, ENV_PRICES, ENV_REVIEWER
from imagebatch.gateway.emulator.options import emulator_arguments
from imagebatch.platform.deploy_metadata import add_arguments as add_metadata_arguments
from imagebatch.platform.worker import GRACE as WORKER_GRACE
from imagebatch.run.constants import FLOW_NAME
from imagebatch.run.exit_codes import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from imagebatch.run.limits import DEFAULT_LIMIT
from imagebatch.run.preflight import DEFAULT_CONCURRENCY, MAX_CONCURRENCY, REDO_CHOICES
from imagebatch.storage.layout import REPORT_HTML, RESULTS_CSV

if TYPE_CHECKING:
    from imagebatch.manifest import Manifest

__all__ = ["EXIT_INCOMPLETE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="imagebatch",
        description=__doc__.splitlines()[0],
        epilog="exit codes: 0 done, 1 some requests did not succeed, 2 invalid manifest or usage "
        "(nothing sent), 130 Ctrl-C, 143 SIGTERM",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _run_arguments(sub.add_parser("run", help="generate everything a manifest asks for"))
    _validate_arguments(sub.add_parser("validate", help="check a manifest and print its plan; sends nothing"))
    emulator_arguments(sub.add_parser("emulator", help="serve the emulated gateway on loopback"))
    report = sub.add_parser("report", help=f"(re)build the contact sheet {REPORT_HTML} of an output folder")
    report.add_argument("out", help="an output folder of `imagebatch run`, or its s3://bucket/prefix")
    report.add_argument(
        "--to",
        default=None,
        metavar="DIR",
        help="for a run in a bucket: copy its report, thumbnails, images and results.csv into DIR (writing "
        "nothing to the bucket) and print the page to open",
    )
    _review_arguments(
        sub.add_parser("review", help="serve the contact sheet on 127.0.0.1 to approve or reject each image")
    )
    _export_arguments(
        sub.add_parser("export", help="write a run's images to DEST as deliverables, named by a template")
    )
    _deploy_arguments(
        sub.add_parser(
            "deploy",
            help="create or update a (scheduled) Prefect deployment of the flow, run by a pool's workers",
        ),
        work_pool=True,
    )
    _deploy_arguments(
        sub.add_parser(
            "serve", help="create or update the deployment and serve its runs from here until Ctrl-C"
        ),
        work_pool=False,
    )
    limits = sub.add_parser("limits", help="create or update the account-wide limits on the Prefect server")
    _limits_arguments(limits)
    _worker_arguments(
        sub.add_parser(
            "worker", help="run `prefect worker start`; on SIGTERM, stop its flow runs gracefully first"
        )
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "sheet", None) is not None:
        if not _workbook(args.manifest, getattr(args, "format", None)):
            print(f"imagebatch {args.command}: --sheet is for an .xlsx manifest", file=sys.stderr)
            return EXIT_USAGE
        args.manifest = type(args.manifest)(f"{args.manifest}#{args.sheet}")  # what a reload reads again
    if args.command == "validate":
        return _validate(args)
    if args.command == "report":
        return _report(args.out, args.to)
    if args.command == "review":
        return _review(args)
    if args.command == "export":
        from imagebatch.delivery.command import export_main

        return export_main(args)
    if args.command == "limits":
        from imagebatch.platform.limits import limits_main

        return limits_main(args)
    if args.command == "emulator":
        from imagebatch.gateway.emulator.serve import serve

        return serve(args)
    if args.command == "worker":
        from imagebatch.platform.worker import worker_main

        return worker_main(args)
    if args.command in ("deploy", "serve"):
        from imagebatch.platform.deploy import deploy_main, serve_main

        return deploy_main(args) if args.command == "deploy" else serve_main(args)
    from imagebatch.cli.terminal import run_main

    return run_main(args)


def _workbook(manifest: str | Path, format: str | None) -> bool:
    return format == "xlsx" or (format is None and Path(manifest).suffix.lower() == ".xlsx")


def _validate(args: argparse.Namespace) -> int:
    """`imagebatch validate`: the manifest's problems or its plan; with --out, what a run into OUT would
    send now (`work.forecast`); with --prices, the most that (or the whole manifest) can cost."""
    from imagebatch.manifest.validate import check_manifest

    if args.redo is not None and args.out is None:
        print(
            "imagebatch validate: --redo needs --out OUT, the output whose results it redoes", file=sys.stderr
        )
        return EXIT_USAGE
    code, manifest = check_manifest(args, keys=args.keys and args.out is None)
    if manifest is None:
        return code
    if args.name is not None:
        from imagebatch.delivery.manifestnames import print_name_check

        if (code := print_name_check(manifest, args.name, slugged=args.slug, out=sys.stdout)) != EXIT_OK:
            return code
    if args.out is not None:
        return _forecast(manifest, args)
    if args.prices:
        return _estimate(manifest, args.prices)
    return code


def _estimate(manifest: Manifest, prices: str) -> int:
    """`validate --prices`: the most the manifest can cost, by model (images at most x price)."""
    from imagebatch.manifest import plan
    from imagebatch.work.prices import PriceError, PriceTable, estimate_lines

    try:
        table = PriceTable.load(prices)
    except PriceError as exc:
        print(f"imagebatch validate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print("\nmost it can cost (images at most x price):")
    print("\n".join(estimate_lines(plan(manifest), table)))
    return EXIT_OK


def _forecast(manifest: Manifest, args: argparse.Namespace) -> int:
    """`validate --out OUT`: what a run into OUT would do now (read only: no lock taken, nothing written;
    a folder that does not exist is not made)."""
    from imagebatch.run.preflight import UsageError, check_output_store, check_redo, output_location
    from imagebatch.work.forecast import forecast, print_forecast
    from imagebatch.work.prices import PriceError, PriceTable
    from imagebatch.work.variants import redo_kinds

    where = output_location(args.out)
    try:
        check_redo(args.redo, args.edit, force=False)
        table = PriceTable.load(args.prices) if args.prices else None
        if isinstance(where, str):
            check_output_store(where, lock=False)
        elif where.exists() and not where.is_dir():
            raise UsageError(f"--out {where} is a file, not a folder")
        result = forecast(
            manifest, where, retry_unknown=args.retry_unknown, redo=redo_kinds(args.redo), edit=args.edit
        )
    except (UsageError, PriceError, OSError) as exc:
        print(f"imagebatch validate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print_forecast(result, manifest, sys.stdout, keys=args.keys, prices=table)
    return EXIT_OK


def _report(out: str, to: str | None = None) -> int:
    """`imagebatch report OUT`: a local folder, or an object store's `s3://bucket/prefix` (the report is
    built from its records and thumbnails, fetched, and uploaded next to them). `to`: a bucket's report
    copied into that folder instead, nothing written to the bucket (`report.download`)."""
    from imagebatch.run.preflight import UsageError, check_output_store, output_location
    from imagebatch.work.store import OutputStore

    where = output_location(out)
    if to is not None and not isinstance(where, str):
        why = f"--to copies a report out of a bucket; {out}/{REPORT_HTML} opens where it is"
        print(f"imagebatch report: {why}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if isinstance(where, str):
            check_output_store(where, lock=False)
        store = OutputStore(where)
        if not store.location.exists(RESULTS_CSV):
            why = f"has no {RESULTS_CSV} (not an output folder of a finished run)"
            print(f"imagebatch report: {store.where} {why}", file=sys.stderr)
            return EXIT_USAGE
        if to is not None:
            from imagebatch.report.download import download_report
            from imagebatch.storage.objectstore import ObjectLocation

            assert isinstance(store.location, ObjectLocation)
            print(download_report(store.location, Path(to).expanduser()).resolve())
            return EXIT_OK
        from imagebatch.report.location import write_report

        print(write_report(store))
    except (UsageError, OSError) as exc:
        print(f"imagebatch report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _review(args: argparse.Namespace) -> int:
    """`imagebatch review OUT`: a local folder, or a bucket's `s3://bucket/prefix` (checked first, as for
    `report`); serves until Ctrl-C (`report.review`)."""
    from imagebatch.report.review import default_reviewer, serve_review
    from imagebatch.run.preflight import UsageError, check_output_store, output_location
    from imagebatch.storage.location import open_location

    where = output_location(args.out)
    try:
        if isinstance(where, str):
            check_output_store(where, lock=False)
        location = open_location(where)
    except (UsageError, OSError) as exc:
        print(f"imagebatch review: {exc}", file=sys.stderr)
        return EXIT_USAGE
    show = [c.strip() for c in args.show.split(",") if c.strip()] if args.show is not None else None
    return serve_review(
        location, default_reviewer(args.reviewer), args.port, show=show, group_by=args.group_by
    )


def _review_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", help="an output folder of `imagebatch run`, or its s3://bucket/prefix")
    parser.add_argument(
        "--port", type=int, default=0, help="port on 127.0.0.1 (default 0: a free one, printed)"
    )
    parser.add_argument(
        "--reviewer",
        default=None,
        help=f"the name decisions are recorded under (default: ${ENV_REVIEWER}, else the login name)",
    )
    parser.add_argument(
        "--show", default=None, help="the manifest's columns each card shows, e.g. sku,colour (default: all)"
    )
    parser.add_argument("--group-by", default=None, help="a column whose equal values sit together, e.g. sku")


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", help=MANIFEST_HELP)
    _sheet_argument(parser)
    parser.add_argument("--out", required=True, help="output folder (created; a rerun resumes from it)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"requests in flight at once, 1 to {MAX_CONCURRENCY} (default {DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--base-url",
        default=None,
        help=f"service root (default: ${ENV_BASE_URL}; with neither, the embedded emulator)",
    )
    parser.add_argument(
        "--rpm",
        type=int,
        default=None,
        help="space request starts to at most this many a minute (default: no pacing)",
    )
    parser.add_argument(
        "--max-images",
        type=int,
        default=None,
        help="stop before a request that could take this run past N images (the rest wait for a rerun)",
    )
    parser.add_argument(
        "--max-spend",
        type=float,
        default=None,
        help="stop before a request that could take this run's estimated spend past AMOUNT (needs --prices)",
    )
    parser.add_argument(
        "--prices",
        default=None,
        help=f"price table (TOML or JSON; default: ${ENV_PRICES}; none: no estimate)",
    )
    parser.add_argument(
        "--no-adaptive",
        dest="adaptive",
        action="store_false",
        help="open --concurrency requests at once instead of starting low and adapting to HTTP 429s",
    )
    parser.add_argument(
        "--no-report",
        dest="report",
        action="store_false",
        help=f"no thumbnails and no {REPORT_HTML} (~15 ms of CPU an image; `imagebatch report OUT` later)",
    )
    _allow_failures_argument(parser)
    parser.add_argument("--force", action="store_true", help="regenerate even what is already done")
    parser.add_argument(
        "--retry-unknown",
        action="store_true",
        help="resend requests whose outcome is unknown (check your usage history first)",
    )
    _redo_arguments(parser)
    _files_root_argument(parser)
    parser.add_argument(
        "--api-key-block",
        default=None,
        help=f"name of a Prefect Secret block holding the API key (default: ${ENV_API_KEY})",
    )
    _global_limit_argument(parser)


def _redo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redo",
        default=None,
        metavar="KINDS",
        help=f"send a new variant of each request whose newest variant is of KINDS ({','.join(REDO_CHOICES)}"
        ", comma separated: rejected by a reviewer, answered without an image, failed), and nothing else "
        "new; earlier variants stay",
    )
    parser.add_argument(
        "--edit",
        action="store_true",
        help="with --redo rejected: make each variant as an edit of the rejected image with the reviewer's "
        "note (native route, where its conversation was kept; else a new sample, counted)",
    )


MANIFEST_HELP = (
    "CSV, JSON, JSON Lines, XLSX (FILE.xlsx#SHEET for a sheet) or Parquet manifest; a CSV or JSON one may "
    "be an object's URL (s3://bucket/m.csv)"
)


def _sheet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sheet",
        default=None,
        metavar="NAME",
        help="the sheet of an .xlsx manifest (default: its first visible sheet); the same as FILE.xlsx#NAME",
    )


def _files_root_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--files-root",
        action="append",
        default=None,
        metavar="DIR",
        help="a folder (or an object store's prefix, s3://bucket/refs) reference images and masks may also "
        "come from, repeatable (default: only the manifest's folder or prefix; see README, Security notes)",
    )


def _allow_failures_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-failures",
        default=None,
        metavar="N|P%",
        help="end Completed (exit 0) with up to N requests (or P%% of them) not done, unless the run was "
        "stopped early (default: none)",
    )


def _global_limit_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--global-limit",
        default=None,
        metavar="NAME",
        help="a Prefect global concurrency limit each request holds while on the wire, shared by every run "
        "and machine (`imagebatch limits`; needs a Prefect server)",
    )


def _work_pool_arguments(parser: argparse.ArgumentParser) -> None:
    """`deploy` only: the work pool that runs it, its shards, and `--check`."""
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="split each run into N runs on the pool's workers (a second deployment NAME-shards)",
    )
    parser.add_argument(
        "--shard-start-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="with --shards: a shard no worker has started within SECONDS is run by the parent's "
        "process once its own shard is done (default 60)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="make every check and set up the heartbeat automation, but deploy nothing "
        "(prefect.yaml's build step)",
    )
    parser.add_argument(
        "--work-pool",
        default=None,
        help="the process work pool whose workers run it "
        "(default: $PREFECT_DEPLOYMENTS_DEFAULT_WORK_POOL_NAME)",
    )


def _deploy_arguments(parser: argparse.ArgumentParser, *, work_pool: bool) -> None:
    """`deploy` and `serve`: the deployment's name, schedule and runner, and `run`'s options that a
    scheduled run may take (not --force nor --retry-unknown: no one is there to decide; --redo rejected
    is decided by the reviewers' decisions, so a team can schedule it)."""
    parser.add_argument("manifest", help=f"{MANIFEST_HELP} (its absolute path, or its URL, is deployed)")
    _sheet_argument(parser)
    parser.add_argument(
        "--out",
        required=True,
        help="output folder or s3://bucket/prefix (gs://, az://), the same for every run: each sends only "
        "new and changed rows",
    )
    parser.add_argument("--name", required=True, help=f"the deployment's name: runs are '{FLOW_NAME}/NAME'")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--cron", default=None, help='cron schedule, e.g. "0 2 * * *" (default: no schedule)')
    when.add_argument("--interval", type=float, default=None, help="schedule: a run every SECONDS")
    parser.add_argument(
        "--timezone", default=None, help="time zone of the schedule, e.g. Europe/Paris (default: UTC)"
    )
    if work_pool:
        _work_pool_arguments(parser)
    add_metadata_arguments(parser, work_pool=work_pool)  # tags, description, ... (platform.deploy_metadata)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"requests in flight at once in a run, 1 to {MAX_CONCURRENCY} (default {DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--base-url",
        default=None,
        help=f"service root, or `embedded` for the emulator (default: ${ENV_BASE_URL} here; one of "
        "them is needed, and is stored in the deployment)",
    )
    parser.add_argument(
        "--api-key-block",
        default=None,
        help=f"a Prefect Secret block holding the API key (default: ${ENV_API_KEY} where the run runs)",
    )
    parser.add_argument("--rpm", type=int, default=None, help="space request starts to at most N a minute")
    parser.add_argument("--max-images", type=int, default=None, help="each run's budget in images")
    parser.add_argument(
        "--max-spend", type=float, default=None, help="each run's budget in money (needs --prices)"
    )
    parser.add_argument("--prices", default=None, help="price table (TOML or JSON)")
    parser.add_argument(
        "--no-adaptive",
        dest="adaptive",
        action="store_false",
        help="open --concurrency requests at once instead of adapting to HTTP 429s",
    )
    parser.add_argument(
        "--no-report", dest="report", action="store_false", help=f"no thumbnails and no {REPORT_HTML}"
    )
    _files_root_argument(parser)
    _allow_failures_argument(parser)
    _global_limit_argument(parser)
    _redo_arguments(parser)


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    """`export`: the choices behind each default are in `delivery/export.py` and `delivery/convert.py`."""
    parser.add_argument("out", help="an output folder of `imagebatch run`, or its s3://bucket/prefix")
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
    _conversion_arguments(parser)
    parser.add_argument(
        "--slug", action="store_true", help="clean names: each value lower-case, spaces (and '/') to '-'"
    )
    parser.add_argument(
        "--prune",
        action="store_true",
        help="remove an earlier export's files this one does not deliver (default: move them to "
        "DEST/.superseded/DATE/)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a file in DEST with other bytes that no earlier export wrote (default: refuse)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="images converted at once (default: every core)",
    )


def _conversion_arguments(parser: argparse.ArgumentParser) -> None:
    """`export`: what each deliverable is made into (`delivery.convert.Conversion`)."""
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
        "--background",
    )


def _limits_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=DEFAULT_LIMIT, help=f"the limit's name (default: {DEFAULT_LIMIT})")
    parser.add_argument(
        "--concurrency",
        type=int,
        required=True,
        help="requests on the wire at once, over every run and machine",
    )
    parser.add_argument(
        "--per-minute",
        type=int,
        default=None,
        help="also at most this many requests a minute (NAME-per-minute; 0 removes it)",
    )


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", required=True, help="the process work pool to poll")
    parser.add_argument("--limit", type=int, default=None, help="the most flow runs at once (Prefect's)")
    parser.add_argument(
        "--grace",
        type=float,
        default=WORKER_GRACE,
        help="seconds the flow runs get to stop after a SIGTERM before the worker stops "
        f"(default {WORKER_GRACE:g})",
    )
    parser.add_argument(
        "extra", nargs=argparse.REMAINDER, help="after --: more options for `prefect worker start`"
    )


def _validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", help=MANIFEST_HELP)
    _sheet_argument(parser)
    parser.add_argument(
        "--format",
        choices=("csv", "json", "jsonl", "xlsx", "parquet"),
        default=None,
        help="the manifest's format (default: from its extension)",
    )
    parser.add_argument(
        "--keys",
        action="store_true",
        help="also list every planned request with its idempotency key (with --out: and its state)",
    )
    parser.add_argument(
        "--prices",
        default=None,
        help="price table: also print the most the manifest (with --out: the run) can cost, by model",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="an output folder or s3://bucket/prefix: also say what a run into it would send now (done, "
        "new, changed, unknown, rejected), reading it only",
    )
    parser.add_argument(
        "--retry-unknown",
        action="store_true",
        help="with --out: count what `run --retry-unknown` would send",
    )
    parser.add_argument(
        "--redo",
        default=None,
        metavar="KINDS",
        help="with --out: what `run --redo KINDS` would send (new variants, edits) and, with --prices, cost",
    )
    parser.add_argument("--edit", action="store_true", help="with --redo: as `run --redo rejected --edit`")
    parser.add_argument(
        "--name",
        default=None,
        metavar="TEMPLATE",
        help="check every row's deliverable name as `export --name TEMPLATE` would make it (unsafe "
        "characters, a '/' in a value, empty or space-padded parts, collisions)",
    )
    parser.add_argument("--slug", action="store_true", help="with --name: as `export --slug` makes them")
    _files_root_argument(parser)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
