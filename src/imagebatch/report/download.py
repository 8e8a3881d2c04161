"""`imagebatch report s3://bucket/prefix --to DIR`: the report of a run in a bucket, copied into a local
folder with everything its relative links name, so that `DIR/report.html` opens as the run's own folder
would.

A copy rather than presigned links: a presigned URL signs one object, so the report's relative links
(`thumbs/...`, `images/...`) would be refused unless every link were rewritten into an expiring bearer
credential. A copy needs only the reader's own read access, works on any store and offline, and writes
nothing to the bucket.
"""

from __future__ import annotations

from pathlib import Path

from imagebatch.report.html import build_report
from imagebatch.report.location import stage
from imagebatch.storage import layout
from imagebatch.storage.bucket import BucketBackend
from imagebatch.storage.location import confined, write_atomic


def download_report(loc: BucketBackend, to: Path) -> Path:
    """Copy what a reviewer needs of the run in `loc` into the folder `to` (created; files already there
    are replaced, report pages no longer in the bucket removed); the report's first page in it.

    What is copied: results.csv and run.json, every output file results.csv names (images and texts),
    thumbs/, and the bucket's report pages when report.html is at least as new as results.csv (a run writes
    it last); otherwise (a run with `--no-report`, or none yet) the report is built here from the copy, with
    its prompts when the manifest run.json names can still be read.
    """
    to.mkdir(parents=True, exist_ok=True)
    with loc.local_copy(to) as copy:
        stage(loc, copy, everything=True)
    report, results = loc.modified(layout.REPORT_HTML), loc.modified(layout.RESULTS_CSV)
    if report is not None and results is not None and report >= results:
        pages = layout.report_pages(loc.list_top())
        for name in pages:
            write_atomic(confined(to, name), loc.get(name) or b"")
        for stale in layout.report_pages(p.name for p in to.iterdir()):
            if stale not in pages:
                (to / stale).unlink()
        return to / layout.REPORT_HTML
    return build_report(to)
