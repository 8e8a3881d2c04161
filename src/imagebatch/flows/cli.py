"""The `imagebatch` command: `run` a manifest, `validate` one, or serve the `emulator`.

Exit codes of `run`: 0 when every request succeeded (or was done before), 1 when some did not, 2 for an
invalid manifest or a usage error (nothing sent).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE = 0, 1, 2


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    from imagebatch.flows.config import DEFAULT_CONCURRENCY, MAX_CONCURRENCY

    parser.add_argument("manifest", help="CSV, JSON or JSON Lines manifest")
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
        help="service root (default: $IMAGEBATCH_BASE_URL; with neither, the embedded emulator)",
    )
    parser.add_argument("--force", action="store_true", help="regenerate even what is already done")
    parser.add_argument(
        "--retry-unknown",
        action="store_true",
        help="resend requests whose outcome is unknown (check your usage history first)",
    )
    parser.add_argument(
        "--api-key-block",
        default=None,
        help="name of a Prefect Secret block holding the API key (default: $IMAGEBATCH_API_KEY)",
    )


def build_parser() -> argparse.ArgumentParser:
    from imagebatch.gateway.emulator.serve import add_arguments as add_emulator_arguments
    from imagebatch.tasks.manifest import add_validate_arguments

    parser = argparse.ArgumentParser(prog="imagebatch", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_arguments(sub.add_parser("run", help="generate everything a manifest asks for"))
    add_validate_arguments(
        sub.add_parser("validate", help="check a manifest and print its plan; sends nothing")
    )
    add_emulator_arguments(sub.add_parser("emulator", help="serve the emulated gateway on loopback"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "validate":
        from imagebatch.tasks.manifest import validate_main

        return validate_main(args)
    if args.command == "emulator":
        from imagebatch.gateway.emulator.serve import main as emulator_main

        return emulator_main(args)
    return run_main(args)


def _quiet_prefect() -> None:
    """Keep the terminal for the progress bar: Prefect's per-task chatter goes to its UI, not here."""
    for name in ("prefect.task_runs", "prefect.flow_runs", "prefect", "httpx", "uvicorn"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def run_main(args: argparse.Namespace) -> int:
    """`imagebatch run`: validate first (exit 2 before anything is sent), then run the flow."""
    from imagebatch.flows.config import (
        ENV_API_KEY,
        MAX_CONCURRENCY,
        UsageError,
        check_api_key,
        resolve_base_url,
    )
    from imagebatch.tasks.manifest import ManifestError, load_manifest

    err = Console(stderr=True, soft_wrap=True)
    out = Console(soft_wrap=True)
    try:
        # Everything that can be checked without Prefect is checked first: a mistake costs no start-up.
        load_manifest(args.manifest)  # the flow loads it again itself, so it can run without this command
        if not 1 <= args.concurrency <= MAX_CONCURRENCY:
            raise UsageError(f"--concurrency must be from 1 to {MAX_CONCURRENCY}")
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise UsageError(f"--out {args.out} is a file, not a folder")
        base_url = resolve_base_url(args.base_url)
        if base_url and not args.api_key_block:
            key = os.environ.get(ENV_API_KEY)
            if not key:
                raise UsageError(f"{base_url} needs an API key: set {ENV_API_KEY} (or --api-key-block NAME).")
            check_api_key(key)
    except ManifestError as exc:
        for problem in exc.problems:
            err.print(str(problem), markup=False, highlight=False)
        err.print(f"{args.manifest}: {len(exc.problems)} problem(s); nothing was sent.", markup=False)
        return EXIT_USAGE
    except UsageError as exc:
        err.print(f"{exc}; nothing was sent.", markup=False)
        return EXIT_USAGE

    _quiet_prefect()
    from imagebatch.flows.batch import (
        ProgressSnapshot,
        RunHooks,
        generate_from_manifest,
        run_hooks,
        settle_prefect_records,
    )

    if not base_url:
        err.print(
            "No service address configured: using the embedded emulator on 127.0.0.1 "
            "(its images are placeholders).",
            markup=False,
        )
    progress = Progress(
        TextColumn("[bold]imagebatch"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not err.is_terminal,
    )
    bar = progress.add_task("run", total=None, stats="starting Prefect")
    t0: list[float] = []  # the rate counts from the first dispatch, not from Prefect's start-up

    def on_progress(snap: ProgressSnapshot) -> None:
        t0 or t0.append(time.monotonic())
        minutes = max(time.monotonic() - t0[0], 1e-6) / 60
        failed = sum(snap.counts.get(s, 0) for s in ("failed", "unknown", "not_attempted"))
        done = sum(snap.counts.get(s, 0) for s in ("succeeded", "skipped", "no_image"))
        rate = snap.images / minutes
        stats = f"done {done}  failed {failed}  in flight {snap.in_flight}  {rate:.1f} img/min"
        progress.update(bar, total=snap.planned, completed=snap.done, stats=stats)

    try:
        with progress, run_hooks(RunHooks(on_progress=on_progress)):
            info = generate_from_manifest(
                manifest=str(args.manifest),
                out=str(args.out),
                concurrency=args.concurrency,
                base_url=args.base_url,
                force=args.force,
                retry_unknown=args.retry_unknown,
                api_key_secret_block=args.api_key_block,
            )
    except UsageError as exc:
        err.print(f"{exc}; nothing was sent.", markup=False)
        return EXIT_USAGE
    with contextlib.suppress(Exception):  # best effort: the output folder is the record, not Prefect's
        settle_prefect_records(info)
    _print_summary(out, info)
    if info.get("stopped"):
        err.print(f"Stopped early: {info['stopped']}. A rerun picks up where this one stopped.", markup=False)
    counts: dict[str, int] = info["counts"]
    if counts.get("unknown"):
        err.print(
            f"{counts['unknown']} request(s) have an unknown outcome (sent, no answer): check the service's "
            "usage history, then rerun with --retry-unknown if they were not generated.",
            markup=False,
        )
    incomplete = sum(v for k, v in counts.items() if k not in ("succeeded", "skipped"))
    return EXIT_INCOMPLETE if incomplete else EXIT_OK


def _print_summary(console: Console, info: dict[str, Any]) -> None:
    console.print(f"imagebatch: {info['requests']} request(s) -> {info['out']}", markup=False)
    table = Table()
    table.add_column("status")
    table.add_column("requests", justify="right")
    for status, n in info["counts"].items():
        if n:
            table.add_row(status, str(n))
    console.print(table)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
