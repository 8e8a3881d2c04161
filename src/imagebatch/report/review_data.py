"""What the review page shows and records: its cards (results.csv's rows with images, newest variant first,
with the manifest's columns), the image files it may serve (only those results.csv names and the image
approved before a row's prompt changed, confined to the output location, and the thumbnails of the
requests' reference images), and the decisions in force and ratings, kept current without reading the
whole record again (`DecisionCache`).

Every read goes through the output location (`storage.location`), so a bucket is reviewed as a folder is.
"""

from __future__ import annotations

import csv
import io
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from imagebatch.manifest.sources import is_url
from imagebatch.report.html import (
    image_paths,
    manifest_details,
    ref_thumb_name,
    reviewable,
    row_facts,
)
from imagebatch.report.review_history import Earlier, Request, earlier_approved
from imagebatch.report.setstate import request_of, status_label, superseded, variant_number
from imagebatch.storage import layout
from imagebatch.storage.backend import Backend
from imagebatch.storage.csvcells import csv_value, read_csv
from imagebatch.work.decisions import Decision, History, decision_line, parse_line, record_named
from imagebatch.work.runsummary import read_summary
from imagebatch.work.store import RESULT_COLUMNS
from imagebatch.work.thumbnails import save_thumbnail

PROMPT_SHOWN = 400
"""A card shows at most this many characters of its prompt (the page holds every card's data)."""


class ReviewError(ValueError):
    """The output location cannot be reviewed (no results.csv): a usage error."""


@dataclass(frozen=True, slots=True)
class ReviewCard:
    """One image request to review: its key and variant, its images, and what the page shows of it."""

    key: str
    variant: int
    images: tuple[str, ...]
    """Its images' names in the output location (`images/<job>/<file>`), each checked by `safe_name`."""
    shown: dict[str, Any]
    """The page's data: `k` key, `v` variant, `nv` variants of its request, `t` title (`card_title`),
    `p` prompt, `f` facts, `n` images, `m` the shown columns' values; where there are any, `r` reference
    images, `s` a status other than made (`MADE`), `pk` the keys of the older variants it replaces (oldest
    first), `x` 1 if a newer variant replaced it, `j` its job's id if the job has several requests; `g`
    its group's value (when grouped)."""
    references: tuple[str, ...] = ()
    """Its request's reference images and mask, as the plan names them (a path, or an object's URL)."""


def safe_name(rel: str) -> bool:
    """Whether an image name from results.csv may be served: relative, under `images/`, plain parts
    (no `..`, `.`, empty part, backslash or control character). A local file is also checked for where
    it really is (`Backend.image`: never a file that leads out)."""
    path = PurePosixPath(rel)
    return (
        path.as_posix() == rel
        and not path.is_absolute()
        and len(path.parts) > 1
        and path.parts[0] == layout.IMAGES_DIR
        and not {"..", "."} & set(path.parts)
        and "\\" not in rel
        and all(ch >= " " and ch != "\x7f" for ch in rel)
    )


@dataclass(frozen=True, slots=True)
class CardSet:
    """The cards of a run, what was left out, and the manifest's columns they show."""

    cards: list[ReviewCard]
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
    raw = location.get(layout.RESULTS_CSV)
    if raw is None:
        raise ReviewError(
            f"{location.url} has no {layout.RESULTS_CSV} (not an output folder of a finished run)"
        )
    text = raw.decode("utf-8", errors="replace")
    rows = list(read_csv(io.StringIO(text, newline=""), layout.RESULTS_READ_COLUMNS))
    header = [csv_value(c) for c in next(csv.reader(io.StringIO(text, newline="")), [])]
    columns = _chosen(header, show, group_by)
    where = f"{location.url}/{layout.RUN_JSON}"
    details = manifest_details(read_summary(location.get(layout.RUN_JSON), where))
    groups: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    without = refused = 0
    for row in rows:
        if not reviewable(row):
            without += 1
            continue
        safe = sum(safe_name(rel) for rel in image_paths(row))
        refused += len(image_paths(row)) - safe
        if safe:
            groups.setdefault(request_of(row), []).append(row)
    requests = list(groups.values())
    if group_by:  # a stable sort by each group's first appearance: one product's colourways together
        first: dict[str, int] = {}
        for variants in requests:
            first.setdefault(variants[0].get(group_by, ""), len(first))
        requests.sort(key=lambda variants: first[variants[0].get(group_by, "")])
    per_job: dict[str, set[str]] = {}
    for variants in requests:
        per_job.setdefault(variants[0]["job_id"], set()).add(variants[0]["request_index"])
    several = {job for job, indexes in per_job.items() if len(indexes) > 1}
    keys = {row["idempotency_key"] for row in rows}
    before = earlier_approved(location, keys, approved or {}, safe_name)
    cards: list[ReviewCard] = []
    for variants in requests:
        cards.extend(_request_cards(variants, details, columns, group_by, several, before))
    earlier = {e.key: e.images for e in before.values()}
    return CardSet(cards, without, refused, columns, group_by, earlier)


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


def decision_json(decision: Decision) -> dict[str, str]:
    """A decision as the page reads it (its key is the map's). Not `asdict`: at 10,000 decisions its deep
    copies took a second of the page's making."""
    return {
        "decision": decision.decision,
        "note": decision.note,
        "reviewer": decision.reviewer,
        "at": decision.at,
    }


class DecisionCache:
    """The decisions in force in a location, by key, refreshed from the record at most once every
    `interval` seconds, and only what is new: a folder's `review.jsonl` is read from where the last read
    stopped (read whole again only if it shrank), a bucket's `review/` listed and only its new objects
    fetched. Each key carries the version at which its decision last changed, so a page asks for what
    changed since the version it has (`since`).

    The record is replayed in its own order (`work.decisions.History`), as `read_decisions` replays it:
    `record` appends a decision (durable before it returns) and then reads the record back, so a
    decision another server appended meanwhile is applied first, as every later reader will."""

    def __init__(
        self, location: Backend, interval: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.location = location
        self.interval = interval
        self.clock = clock
        self.version = 0
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._undoing = threading.Lock()
        self._replayed = History()
        self._ignored: set[Decision] = set()  # undos read that took nothing back (another's came first)
        self._changed: dict[str, int] = {}
        self._checked = float("-inf")
        self._tail = location.decision_tail()
        self.refresh(force=True)

    def record(self, decision: Decision) -> Decision:
        """Append `decision` and read the record back; the decision in force on its image then. In a
        bucket, the new object is put in force as the last one read instead of listing them all again
        (a listing per decision took 0.7 s at 2,000 decisions); one another server made meanwhile that
        sorts before it is then listed before an object already read, and the whole record replayed."""
        stored, name = record_named(self.location, decision)
        if self._tail.wrote(name, decision_line(stored)):
            with self._lock:
                self._apply([stored])
        else:
            self.refresh(force=True)
        with self._lock:
            return self._replayed.in_force.get(stored.key, stored)

    def undo(self, reviewer: str, key: str = "", batch: str = "") -> tuple[dict[str, Decision], list[str]]:
        """Take back `reviewer`'s decision on `key`, or each decision of their bulk approve `batch`, where
        it is still the one in force (`History.refusal`). Returns the decisions in force then on the
        images it touched, and why each one not taken back was not. One undo at a time per server."""
        with self._undoing:
            self.refresh(force=True)
            with self._lock:
                keys = self._replayed.batch_keys(batch, reviewer) if batch else [key]
                refused = [why for k in keys if (why := self._replayed.refusal(k, reviewer, batch or None))]
                lines = [
                    self._replayed.undo(k, reviewer, batch)
                    for k in keys
                    if self._replayed.refusal(k, reviewer, batch or None) is None
                ]
            stored = [record_named(self.location, line)[0] for line in lines]
            self.refresh(force=True)
            with self._lock:
                lost = [d for d in stored if d in self._ignored]  # another server's decision came first
                refused += ["another reviewer decided it while you undid; their decision stands"] * len(lost)
                return {k: d for k in keys if (d := self._replayed.in_force.get(k)) is not None}, refused

    def undo_stack(self, reviewer: str) -> list[tuple[str, str]]:
        """What `reviewer` can still undo (`History.undo_stack`), from the record as it is now."""
        self.refresh(force=True)
        with self._lock:
            return self._replayed.undo_stack(reviewer)

    def approved(self) -> dict[str, Decision]:
        """The approvals in force now, by key."""
        self.refresh()
        with self._lock:
            return {k: d for k, d in self._replayed.in_force.items() if d.decision == "approved"}

    def since(self, version: int) -> tuple[int, dict[str, Decision]]:
        """The current version and the decisions that changed after `version` (all for -1)."""
        self.refresh()
        with self._lock:
            in_force = self._replayed.in_force
            return self.version, {k: in_force[k] for k in self._since(version) if k in in_force}

    def changes(
        self, version: int
    ) -> tuple[int, dict[str, tuple[Decision, list[Decision]]], dict[str, Decision]]:
        """`since`, each decision in force with every reviewer's own standing on its image
        (`History.opinions`), so that a page shows two reviewers who disagree; and the ratings that
        changed (`History.stars`)."""
        self.refresh()
        with self._lock:
            replayed = self._replayed
            in_force, stars, keys = replayed.in_force, replayed.stars, self._since(version)
            changed = {k: (in_force[k], replayed.opinions(k)) for k in keys if k in in_force}
            return self.version, changed, {k: stars[k] for k in keys if k in stars}

    def _since(self, version: int) -> list[str]:
        """The keys changed after `version`: `_changed` is kept in the order of its versions (a changed
        key moves to the end), so a poll reads only what changed, not every image (the caller holds the
        lock)."""
        keys: list[str] = []
        for key in reversed(self._changed):
            if self._changed[key] <= version:
                break
            keys.append(key)
        return keys[::-1]

    def refresh(self, force: bool = False) -> None:
        """Read what was recorded since the last read (by this or another server), unless that was less
        than `interval` seconds ago. One refresh at a time; a caller that finds one running goes on."""
        if not force and self.clock() - self._checked < self.interval:
            return
        if not self._refreshing.acquire(blocking=force):
            return
        try:
            self._checked = self.clock()
            lines, whole = self._tail.read()
            decisions = [d for where, raw in lines if (d := parse_line(raw, where)) is not None]
            with self._lock:
                self._apply(decisions, whole=whole)
        finally:
            self._refreshing.release()

    def _apply(self, decisions: list[Decision], whole: bool = False) -> None:
        """Replay `decisions`, in order, onto the record read so far (`whole`: as the whole record, read
        again), and mark the images whose decision in force, or rating, changed (the caller holds the
        lock)."""
        before: dict[str, tuple[Decision | None, Decision | None]] = {}
        if whole:
            before.update((k, self._state(k)) for k in {*self._replayed.in_force, *self._replayed.stars})
            self._replayed = History()
        for decision in decisions:
            if not whole and decision.key not in before:
                before[decision.key] = self._state(decision.key)
            if not self._replayed.apply(decision):
                self._ignored.add(decision)
        now = self._replayed
        keys = {*before, *now.in_force, *now.stars} if whole else before
        changed = [key for key in keys if self._state(key) != before.get(key, (None, None))]
        if changed:
            self.version += 1
            for key in changed:
                self._changed.pop(key, None)  # to the end: `_since` reads from the newest back
                self._changed[key] = self.version

    def _state(self, key: str) -> tuple[Decision | None, Decision | None]:
        """What the page shows of `key`'s record: its decision in force and its rating."""
        return self._replayed.in_force.get(key), self._replayed.stars.get(key)
