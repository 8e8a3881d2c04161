"""What the review page shows and records: its cards (results.csv's rows with images, newest variant first,
with the manifest's columns), the image files it may serve (only those results.csv names and the image
approved before a row's prompt changed, confined to the output location, and the thumbnails of the
requests' reference images).

results.csv is read once, a row at a time, into an index on disk (`report.rowindex`), and the cards are
made from it a request at a time into a store on disk (`report.cardstore`): the server holds neither the
rows nor the cards. Every read goes through the output location (`storage.backend`), so a bucket is
reviewed as a folder is.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from imagebatch.manifest.sources import is_url
from imagebatch.report.cardstore import CardStore, ReviewCard
from imagebatch.report.details import manifest_details
from imagebatch.report.html import image_paths, ref_thumb_name, reviewable, row_facts
from imagebatch.report.review_history import Earlier, Request, earlier_approved
from imagebatch.report.rowindex import RowIndex
from imagebatch.report.setstate import request_of, status_label, superseded, variant_number
from imagebatch.storage import layout
from imagebatch.storage.backend import Backend
from imagebatch.storage.bounded import open_record
from imagebatch.storage.csvcells import csv_value, read_csv
from imagebatch.work.decisions import Decision
from imagebatch.work.runsummary import read_summary
from imagebatch.work.store import RESULT_COLUMNS
from imagebatch.work.thumbnails import save_thumbnail

PROMPT_SHOWN = 400
"""A card shows at most this many characters of its prompt (the page holds every card's data)."""


class ReviewError(ValueError):
    """The output location cannot be reviewed (no results.csv): a usage error."""


def safe_name(rel: str) -> bool:
    """Whether an image name from results.csv may be served: relative, under `images/`, plain parts
    (no `..`, `.`, empty part, backslash or control character). A local file is also checked for where
    it really is (`Backend.image`: never a file that leads out)."""
    # Split by hand: pathlib interns every part it parses (`sys.intern`), so a path object per row would
    # keep every image folder's name for the life of the process.
    parts = rel.split("/")
    return (
        len(parts) > 1
        and parts[0] == layout.IMAGES_DIR
        and not {"", ".", ".."} & set(parts)
        and "\\" not in rel
        and all(ch >= " " and ch != "\x7f" for ch in rel)
    )


@dataclass(frozen=True, slots=True)
class CardSet:
    """The cards of a run, what was left out, and the manifest's columns they show."""

    cards: CardStore
    """By key, in the page's order (`CardStore.ordered`)."""
    without: int
    """Requests with no image to review (report.html shows them)."""
    refused: int
    """Image names refused (not `safe_name`)."""
    columns: list[str]
    """The columns each card shows (its `m`, in this order)."""
    group_by: str | None = None
    earlier: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The images approved before a row's prompt changed, by their key (`review_history`): served
    beside the new request's cards."""


def metadata_columns(header: Sequence[str]) -> list[str]:
    """results.csv's columns that are the manifest's own (its metadata: `sku`, `colour`, ...), in order."""
    return [c for c in header if c not in RESULT_COLUMNS]


def _chosen(header: list[str], show: Sequence[str] | None, group_by: str | None) -> list[str]:
    """The columns to show: `show` (each checked against results.csv), else every metadata column."""
    for flag, names in (("--show", show or ()), ("--group-by", [group_by] if group_by else [])):
        for name in names:
            if name not in header:
                known = ", ".join(metadata_columns(header) or header)
                raise ReviewError(f"{flag}: results.csv has no column {name!r} (its columns: {known})")
    return list(show) if show is not None else metadata_columns(header)


def reference_thumbnail(location: Backend, ref: str) -> bytes | None:
    """The thumbnail of a request's reference image (or mask) `ref` as the report names it, in the output
    location's thumbs/; in a folder, made there from the manifest's file if missing (the reference itself
    is never served). None if there is none."""
    name = f"{layout.THUMBS_DIR}/{ref_thumb_name(ref)}.jpg"
    made = location.thumbnail(name, None if is_url(ref) else Path(ref), save_thumbnail)
    return None if made is None else made[0]


def load_cards(
    location: Backend,
    show: Sequence[str] | None = None,
    group_by: str | None = None,
    approved: Mapping[str, Decision] | None = None,
) -> CardSet:
    """The cards of the run in `location`. Cards keep results.csv's order of requests (job, request,
    turn), each request's variants newest first; with `group_by`, the requests sharing that column's
    value sit together (groups in the order of their first request). Each card shows the `show` columns
    (default: the manifest's metadata columns); with the `approved` decisions, a changed row's cards
    carry the image approved before (`review_history`). Raises `ReviewError` without results.csv, or for a
    column it does not have."""
    index = RowIndex()
    try:
        with location.local_copy() as copy:
            copy.fetch([layout.RESULTS_CSV])
            columns, without, refused = _index_rows(copy.folder / layout.RESULTS_CSV, index, show, group_by)
            if columns is None:
                raise ReviewError(
                    f"{location.url} has no {layout.RESULTS_CSV} (not an output folder of a finished run)"
                )
        where = f"{location.url}/{layout.RUN_JSON}"
        details = manifest_details(read_summary(location.get(layout.RUN_JSON), where))
        before = earlier_approved(location, index.done(), approved or {}, safe_name)
        cards = CardStore()
        for variants, several in index.requests():
            jobs = {variants[0]["job_id"]} if several else set()
            for card in _request_cards(variants, details, columns, group_by, jobs, before):
                cards.add(card)
    finally:
        index.close()
    earlier = {e.key: e.images for e in before.values()}
    return CardSet(cards.done(), without, refused, columns, group_by, earlier)


def _index_rows(
    path: Path, index: RowIndex, show: Sequence[str] | None, group_by: str | None
) -> tuple[list[str] | None, int, int]:
    """Add results.csv's rows at `path` to `index` (a card's row kept), a row at a time; the columns to
    show (None if there is no results.csv), the rows without an image and the image names refused."""
    header = _header(path)
    if header is None:
        return None, 0, 0
    columns = _chosen(header, show, group_by)
    without = refused = 0
    with _text(path) as text:
        for row in read_csv(text, layout.RESULTS_READ_COLUMNS):
            if not reviewable(row):
                without += 1
                index.add(row, kept=False)
                continue
            safe = sum(safe_name(rel) for rel in image_paths(row))
            refused += len(image_paths(row)) - safe
            index.add(row, kept=safe > 0, group=row.get(group_by, "") if group_by else "")
    return columns, without, refused


def _text(path: Path) -> IO[str]:
    """results.csv as text (a byte that is not UTF-8 read as U+FFFD), through `storage.bounded`: a FIFO
    or a device in its place is refused, never waited on."""
    fh = open_record(path)
    if fh is None:
        raise ReviewError(f"{path}: no such file")
    return io.TextIOWrapper(fh, encoding="utf-8", errors="replace", newline="")


def _header(path: Path) -> list[str] | None:
    """results.csv's columns; None if there is no results.csv."""
    try:
        with _text(path) as text:
            return [csv_value(c) for c in next(csv.reader(text), [])]
    except ReviewError:
        return None


def _request_cards(
    variants: list[dict[str, str]],
    details: Mapping[str, Any],
    columns: list[str],
    group_by: str | None,
    several: set[str],
    before: Mapping[Request, Earlier],
) -> list[ReviewCard]:
    """One request's cards (its variants with images, newest first); each names the older variants it
    replaces (`pk`, oldest first), and the image approved before its prompt changed (`h`)."""
    # A later variant's key is its own; its prompt and references are its request's (any variant the
    # plan knows).
    planned = next((details[r["idempotency_key"]] for r in variants if r["idempotency_key"] in details), None)
    prompt = str(getattr(planned, "prompt", "") or "")
    refs = [*getattr(planned, "reference_images", []), *filter(None, [getattr(planned, "mask", None)])]
    made: list[ReviewCard] = []
    replaced = superseded(variants)
    earlier = before.get(request_of(variants[0]))
    for row in sorted(variants, key=variant_number):
        images = tuple(rel for rel in image_paths(row) if safe_name(rel))
        key, variant = row["idempotency_key"], variant_number(row)
        data = {
            "k": key, "v": variant, "nv": len(variants), "t": card_title(row, several),
            "p": _clipped(prompt),
            "f": " · ".join([*row_facts(row), f"key {key[:16]}"]), "n": len(images),
            "m": [row.get(c, "") for c in columns],
        }  # fmt: skip
        # The rest only where it is not the usual (10,000 cards: each key left out saves 60 KB of page)
        extra = {
            "r": len(refs), "pk": [c.key for c in made], "x": int(key in replaced),
            "s": "" if row["status"] in MADE else status_label(row["status"]),
        }  # fmt: skip
        data |= {name: value for name, value in extra.items() if value}
        if group_by:
            data["g"] = row.get(group_by, "")
        if row["job_id"] in several:  # its candidates, the pick's choice (the page's `candidates`)
            data["j"] = row["job_id"]
        if earlier is not None:
            data["h"] = earlier.shown()
        made.append(ReviewCard(key, variant, images, data, tuple(str(ref) for ref in refs)))
    return made[::-1]


MADE = ("succeeded", "skipped")
"""The statuses a card does not show: its image was made, in this run or an earlier one ("done earlier"
read as stale on a variant made minutes before); any other status is shown."""


def card_title(row: Mapping[str, str], several: set[str]) -> str:
    """A card's title: the row's id, then `request N` (counted from 1) only for a job of several
    requests, and `turn N` for a chain's later turns (never the `#0` every one-request job had)."""
    title = row["job_id"]
    if row["job_id"] in several and row["request_index"].isdigit():
        title += f" request {int(row['request_index']) + 1}"
    if row.get("turn_index") not in (None, "", "0"):
        title += f" turn {row['turn_index']}"
    return title


def _clipped(prompt: str) -> str:
    return prompt[:PROMPT_SHOWN] + ("…" if len(prompt) > PROMPT_SHOWN else "")
