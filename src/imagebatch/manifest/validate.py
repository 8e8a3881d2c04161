"""`imagebatch validate MANIFEST`: check a manifest and show its plan, sending nothing.

`imagebatch.cli.main` defines the command's options and calls `check_manifest(args)`; what a run into an
output location would do (`--out`) is `work.forecast`, which the command prints after the plan.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from imagebatch.storage.location import shown_url

from .load import load_manifest
from .models import Manifest, ManifestError
from .plan import plan, summarise_jobs

EXIT_VALID = 0
EXIT_INVALID = 2


def validate_main(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Print every problem (one per line), or the plan; return 0 when valid and 2 when not.

    Everything goes to `out` (standard output by default): the problems are the command's report, meant
    to be read, piped or grepped. No request is sent and no API key is needed.
    """
    return check_manifest(args, out=out)[0]


def check_manifest(
    args: argparse.Namespace, *, out: TextIO | None = None, keys: bool | None = None
) -> tuple[int, Manifest | None]:
    """`validate_main`, also returning the manifest when it is valid (for what the command prints next);
    `keys` (default: `args.keys`) lists the planned requests."""
    out = out if out is not None else sys.stdout
    name = shown_url(args.manifest)
    try:
        manifest = load_manifest(
            args.manifest, format=getattr(args, "format", None), files_root=getattr(args, "files_root", None)
        )
    except ManifestError as exc:
        for problem in exc.problems:
            print(problem, file=out)
        n = len(exc.problems)
        print(f"{name}: {n} problem{'s' if n != 1 else ''}; nothing was sent", file=out)
        return EXIT_INVALID, None
    summary = summarise_jobs(manifest.jobs)  # the keys are made only when they are listed
    kind = manifest.format if manifest.sheet is None else f"{manifest.format}, sheet {manifest.sheet!r}"
    print(f"{name}: valid ({kind}, sha256 {manifest.sha256[:16]}); nothing was sent", file=out)
    print(summary.table(), file=out)
    if getattr(args, "keys", False) if keys is None else keys:
        print(file=out)
        print("job_id\trequest_index\tturn_index\troute\tmodel\tidempotency_key", file=out)
        for r in plan(manifest):
            print(
                f"{r.job_id}\t{r.request_index}\t{r.turn_index}\t{r.route.value}\t{r.model}\t{r.idempotency_key}",
                file=out,
            )
    return EXIT_VALID, manifest
