"""`imagebatch validate MANIFEST`: check a manifest and show its plan, sending nothing.

The CLI owner wires `add_validate_arguments` and `validate_main` into the `imagebatch` command; `main`
runs the same thing standalone (``python -m imagebatch.tasks.manifest_cli MANIFEST``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from .manifest_load import load_manifest
from .manifest_models import ManifestError
from .manifest_plan import plan, summarise

EXIT_VALID = 0
EXIT_INVALID = 2


def add_validate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the `validate` command's arguments to `parser` (a subcommand parser) and return it."""
    parser.add_argument("manifest", type=Path, help="the manifest: .csv, .json or .jsonl")
    parser.add_argument(
        "--format",
        choices=("csv", "json", "jsonl"),
        default=None,
        help="the manifest's format (default: from its extension)",
    )
    parser.add_argument(
        "--keys",
        action="store_true",
        help="also list every planned request with its idempotency key",
    )
    return parser


def validate_main(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Print every problem (one per line), or the plan; return 0 when valid and 2 when not.

    Everything goes to `out` (standard output by default): the problems are the command's report, meant
    to be read, piped or grepped. No request is sent and no API key is needed.
    """
    out = out if out is not None else sys.stdout
    name = args.manifest
    try:
        manifest = load_manifest(args.manifest, format=getattr(args, "format", None))
    except ManifestError as exc:
        for problem in exc.problems:
            print(problem, file=out)
        n = len(exc.problems)
        print(f"{name}: {n} problem{'s' if n != 1 else ''}; nothing was sent", file=out)
        return EXIT_INVALID
    requests = plan(manifest)
    summary = summarise(requests)
    print(f"{name}: valid ({manifest.format}, sha256 {manifest.sha256[:16]}); nothing was sent", file=out)
    print(summary.table(), file=out)
    if getattr(args, "keys", False):
        print(file=out)
        print("job_id\trequest_index\tturn_index\troute\tmodel\tidempotency_key", file=out)
        for r in requests:
            print(
                f"{r.job_id}\t{r.request_index}\t{r.turn_index}\t{r.route.value}\t{r.model}\t{r.idempotency_key}",
                file=out,
            )
    return EXIT_VALID


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="imagebatch validate", description="Check a manifest and show its plan, sending nothing."
    )
    add_validate_arguments(parser)
    return validate_main(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
