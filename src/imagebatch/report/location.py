"""The report of a run wherever its output location is (`write_report`): built in place in a folder; for an
object store, its records and thumbnails fetched into a staging folder, the report built there and its
pages and new thumbnails uploaded (`report_in`). `stage` is also what `imagebatch report URL --to DIR`
copies (`report.download`)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebatch.report.html import build_report
from imagebatch.storage import layout
from imagebatch.storage.csvcells import read_csv
from imagebatch.storage.objectstore import READ_THREADS, ObjectLocation
from imagebatch.work.decisions import decided
from imagebatch.work.store import OutputStore

if TYPE_CHECKING:
    from imagebatch.manifest import PlannedRequest


def write_report(store: OutputStore, details: Mapping[str, PlannedRequest] | None = None) -> str:
    """Write report.html (and its thumbnails) into the store's location; where it is, as a message says it."""
    if isinstance(store.location, ObjectLocation):
        return report_in(store.location, details)
    return str(build_report(store.root, details=details))


def report_in(loc: ObjectLocation, details: Any = None, to: Any = None) -> str:
    """Build report.html for the run in `loc`: its records and thumbnails are fetched into a staging
    folder (or `to`, which then keeps them), an image only where its thumbnail is missing, the report is
    built there and its pages and new thumbnails uploaded. Returns the report's URL."""
    with contextlib.ExitStack() as stack:
        folder = Path(to) if to is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        had = stage(loc, folder)
        build_report(folder, details=details, decisions=decided(loc))
        pages = sorted(layout.report_pages(p.name for p in folder.iterdir()))
        thumbs = layout.THUMBS_DIR
        made = [p for p in (folder / thumbs).glob("*.jpg") if f"{thumbs}/{p.name}" not in had]
        for path in [*(folder / n for n in pages), *made]:
            loc.put(path.relative_to(folder).as_posix(), path.read_bytes())
        for stale in layout.report_pages(loc.list_top()):
            if stale not in pages:
                loc.delete(stale)
    return f"{loc.url}/{layout.REPORT_HTML}"


def stage(loc: ObjectLocation, folder: Any, everything: bool = False) -> set[str]:
    """Fetch what the report reads into `folder`: run.json, results.csv, thumbs/, the text outputs, and
    each image whose thumbnail is missing (`everything`: every image). An image with a thumbnail is left
    as an empty placeholder dated 1970, so the report keeps the thumbnail. Returns the thumbnails fetched."""
    from pathlib import Path

    from imagebatch.report.html import thumb_name

    folder = Path(folder)
    thumbs = set(loc.list(f"{layout.THUMBS_DIR}/"))
    wanted = [n for n in (layout.RUN_JSON, layout.RESULTS_CSV) if loc.exists(n)] + sorted(thumbs)
    placeholders: list[str] = []
    if layout.RESULTS_CSV in wanted:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / layout.RESULTS_CSV).write_bytes(loc.get(layout.RESULTS_CSV) or b"")
        for row in read_csv(folder / layout.RESULTS_CSV):
            for rel in filter(None, row.get("paths", "").split(";")):
                image = rel.endswith((".png", ".jpg", ".jpeg"))
                if image and not everything and f"{layout.THUMBS_DIR}/{thumb_name(rel)}.jpg" in thumbs:
                    placeholders.append(rel)
                else:
                    wanted.append(rel)
    inside = folder.resolve()
    wanted, placeholders = (  # a name that would climb out of the folder (`..`) is not fetched
        [n for n in names if (inside / n).resolve().is_relative_to(inside)]
        for names in (wanted, placeholders)
    )
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="imagebatch-stage") as ex:
        for name, data in zip(wanted, ex.map(loc.get, wanted), strict=True):
            if data is not None:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_bytes(data)
    for rel in placeholders:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).touch()
        os.utime(folder / rel, (0, 0))
    return thumbs
