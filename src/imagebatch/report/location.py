"""The report of a run wherever its output location is (`write_report`): built in a local copy of the
location (`storage.backend.Backend.local_copy`: a folder is its own; a bucket's records and thumbnails are
fetched into a staging folder), its pages and new thumbnails then published back. `stage` is also what
`imagebatch report URL --to DIR` copies (`report.download`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from imagebatch.report.details import Shown
from imagebatch.report.html import build_report, thumb_name
from imagebatch.storage import layout
from imagebatch.storage.backend import Backend, LocalCopy
from imagebatch.storage.csvcells import read_csv
from imagebatch.work.decisions import decided
from imagebatch.work.store import OutputStore

if TYPE_CHECKING:
    from imagebatch.manifest import PlannedRequest


def write_report(store: OutputStore, details: Mapping[str, PlannedRequest | Shown] | None = None) -> str:
    """Write report.html (and its thumbnails) into the store's location; where it is, as a message says it."""
    return report_in(store.backend, details)


def report_in(place: Backend, details: Any = None) -> str:
    """Build report.html for the run in `place` in its local copy, an image fetched only where its
    thumbnail is missing, then publish its pages and new thumbnails and remove the pages it no longer
    makes. Returns where the report is."""
    with place.local_copy() as copy:
        had = stage(place, copy)
        build_report(copy.folder, details=details, decisions=decided(place))
        pages = sorted(layout.report_pages(p.name for p in copy.folder.iterdir()))
        thumbs = layout.THUMBS_DIR
        made = [f"{thumbs}/{p.name}" for p in (copy.folder / thumbs).glob("*.jpg")]
        copy.publish([*pages, *(n for n in made if n not in had)])
        copy.remove(n for n in layout.report_pages(copy.top_names()) if n not in pages)
    return f"{place.url}/{layout.REPORT_HTML}"


def stage(place: Backend, copy: LocalCopy, everything: bool = False) -> set[str]:
    """Have in the copy what the report reads: run.json, results.csv, thumbs/, the text outputs, and each
    image whose thumbnail is missing (`everything`: every image). An image with a thumbnail is left as an
    empty placeholder, so the report keeps the thumbnail. Returns the thumbnails that were there."""
    copy.fetch([layout.RUN_JSON, layout.RESULTS_CSV])
    thumbs = set(place.list(f"{layout.THUMBS_DIR}/"))
    wanted, placeholders = sorted(thumbs), []
    if (copy.folder / layout.RESULTS_CSV).is_file():
        for row in read_csv(copy.folder / layout.RESULTS_CSV):
            for rel in filter(None, row.get("paths", "").split(";")):
                image = rel.endswith((".png", ".jpg", ".jpeg"))
                if image and not everything and f"{layout.THUMBS_DIR}/{thumb_name(rel)}.jpg" in thumbs:
                    placeholders.append(rel)
                else:
                    wanted.append(rel)
    copy.fetch(wanted, placeholders)
    return thumbs
