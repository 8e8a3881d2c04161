"""export.csv: the list an export writes into DEST, one row per deliverable of the manifest, and the next
export's memory of what the previous one wrote.

A deliverable is a request of results.csv (job, request, turn) and, for a request that returns several
images, each of its images. Its row says whether it was `delivered` (its path in DEST and the file's
facts) or is `missing` and why (`REASONS`), with the manifest's own columns (results.csv's metadata
columns, so the list can be pasted back into a product database), the variant, the review decision, the
reviewer and the decision's time. Then where the file came from and how it was made, which let the next
export know what it would write without converting, and which of DEST's files it wrote itself (a file
export.csv lists with that sha256 is export's own: the next export replaces or sets it aside freely).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from typing import Any

from imagebatch.storage.csvcells import csv_value, read_csv, write_csv
from imagebatch.storage.layout import EXPORT_CSV
from imagebatch.storage.location import Location
from imagebatch.work.decisions import Decision
from imagebatch.work.store import RESULT_COLUMNS

DELIVERED, MISSING = "delivered", "missing"
REASONS = {
    "unreviewed": "no reviewer has approved or rejected its newest image (--approved-only)",
    "rejected": "its newest image was rejected (`imagebatch run --redo rejected` makes another)",
    "changed since approval": "its row changed after an image of it was approved: the new one is not",
    "no image": "the service answered without an image (`--redo no_image` asks again)",
    "failed": "its request failed",
    "unknown": "its request's outcome is unknown (`--retry-unknown`)",
    "not attempted": "its request was not sent (a budget, or a stopped run)",
}
"""Why a deliverable is missing, as export.csv's `reason` says it."""
HEAD_COLUMNS = ("path", "status", "reason", "job_id")
DECISION_COLUMNS = ("variant", "decision", "reviewer", "decided_at", "note", "stars")
"""`stars`: the image's latest star rating, 1 to 5 (empty: unrated; `work.decisions.RATED`)."""
FILE_COLUMNS = (
    "idempotency_key",
    "request_index",
    "turn_index",
    "n",
    "sha256",
    "bytes",
    "width",
    "height",
    "below_size",
    "source",
    "source_sha256",
    "conversion",
)
OWN_COLUMNS = (*HEAD_COLUMNS, *DECISION_COLUMNS, *FILE_COLUMNS)
"""export.csv's columns but the manifest's, which go between `job_id` and `variant`."""


def manifest_columns(results_columns: Iterable[str]) -> list[str]:
    """results.csv's metadata columns (the manifest's own), but one named like a column of export.csv's
    own (it could not be told apart; results.csv keeps it)."""
    return [c for c in results_columns if c not in RESULT_COLUMNS and c not in OWN_COLUMNS]


def decision_cells(decision: Decision | None) -> dict[str, str]:
    if decision is None:
        return {"decision": "", "reviewer": "", "decided_at": "", "note": ""}
    return {
        "decision": decision.decision,
        "reviewer": decision.reviewer,
        "decided_at": decision.at,
        "note": decision.note,
    }


def export_csv(columns: list[str], rows: Iterable[Mapping[str, Any]]) -> bytes:
    """export.csv's bytes: `OWN_COLUMNS` with the manifest's `columns` after `job_id`."""
    header = [*HEAD_COLUMNS, *columns, *DECISION_COLUMNS, *FILE_COLUMNS]
    buf = io.StringIO()
    write_csv(buf, header, rows)
    return buf.getvalue().encode()


def table(data: bytes) -> tuple[list[str], list[dict[str, str]]]:
    """A CSV file's columns and rows (cells as written, before formula-proofing)."""
    text = data.decode("utf-8")
    header = next(csv.reader(io.StringIO(text)), [])
    return [csv_value(c) for c in header], list(read_csv(io.StringIO(text, newline="")))


def listed(dest: Location) -> dict[str, dict[str, str]]:
    """The files DEST's export.csv (from an earlier export) lists as delivered, by path (empty if there
    is none, or it is unreadable). A list from before `status` was a column lists delivered files only."""
    data = dest.get(EXPORT_CSV)
    if data is None:
        return {}
    try:
        rows = table(data)[1]
    except (UnicodeDecodeError, csv.Error):
        return {}
    return {row["path"]: row for row in rows if row.get("path") and row.get("status", DELIVERED) == DELIVERED}
