"""Loading a manifest: read it, check every row, and return the Manifest or every problem at once."""

from __future__ import annotations

from pathlib import Path

from .check import JobChecker
from .models import Manifest, ManifestError, ManifestFormat, Problem
from .read import read_raw


def load_manifest(path: str | Path, *, format: ManifestFormat | None = None) -> Manifest:
    """Read and check a manifest; raise ManifestError with every problem found, or return it.

    `format` overrides the format the extension implies. Relative file paths in the manifest resolve
    against the manifest's folder. Each referenced file is read once, whatever the number of rows.
    """
    path = Path(path).absolute()
    raw = read_raw(path, format)
    checker = JobChecker(raw, path.parent)
    jobs = [job for row in raw.rows if (job := checker.check(row)) is not None]
    problems = raw.problems + checker.problems
    if not raw.rows and not problems:
        problems.append(Problem(None, None, None, "the manifest has no jobs"))
    if problems:
        raise ManifestError(problems, path)
    return Manifest.model_construct(
        path=path, sha256=raw.sha256, format=raw.format, jobs=jobs, metadata_columns=checker.metadata_columns
    )
