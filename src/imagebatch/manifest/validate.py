"""What `imagebatch validate MANIFEST` says of a manifest, as lines: every problem of an invalid one, or
the plan of a valid one (sending nothing).

`imagebatch.cli.validate` loads the manifest, prints these lines and chooses the exit code; what a run
into an output location would do (`--out`) is `work.forecast`, which the command prints after the plan.
"""

from __future__ import annotations

from collections.abc import Iterator

from imagebatch.storage.location import shown_url

from .load import ManifestSummary
from .models import Manifest, ManifestError
from .plan import plan, summarise_jobs


def problem_lines(source: str, exc: ManifestError) -> Iterator[str]:
    """Every problem of the manifest at `source` (one per line), then how many there were."""
    for problem in exc.problems:
        yield str(problem)
    n = len(exc.problems)
    yield f"{shown_url(source)}: {n} problem{'s' if n != 1 else ''}; nothing was sent"


def plan_lines(source: str, manifest: Manifest, *, keys: bool = False) -> Iterator[str]:
    """The valid manifest's format and digest, its plan's summary table and, with `keys`, every planned
    request with its idempotency key (tab-separated: meant to be read, piped or grepped)."""
    summary = summarise_jobs(manifest.jobs)  # the keys are made only when they are listed
    counted = ManifestSummary(manifest.path, manifest.sha256, manifest.format, manifest.sheet, summary)
    yield from summary_lines(source, counted)
    if keys:
        yield ""
        yield "job_id\trequest_index\tturn_index\troute\tmodel\tidempotency_key"
        for r in plan(manifest):
            yield "\t".join(
                (r.job_id, str(r.request_index), str(r.turn_index), r.route.value, r.model, r.idempotency_key)
            )


def summary_lines(source: str, summary: ManifestSummary) -> Iterator[str]:
    """The valid manifest's format and digest, then its plan's summary table: `plan_lines` without keys,
    from a manifest checked and counted (`summarise_manifest`) rather than loaded."""
    kind = summary.format if summary.sheet is None else f"{summary.format}, sheet {summary.sheet!r}"
    yield f"{shown_url(source)}: valid ({kind}, sha256 {summary.sha256[:16]}); nothing was sent"
    yield summary.plan.table()
