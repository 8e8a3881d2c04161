"""A reviewer's decisions on a run's images: approved, rejected (with a note), not chosen (another was
picked), or cleared (undone); comments, a note on an image not yet decided (`COMMENT`); and star ratings
(`RATED`), apart from the decisions.

Decisions are appended, never rewritten, so two reviewers (two browsers, or two `imagebatch review`
servers on one output location) lose nothing of each other's. They are a history, not a stack
(`History`): the latest decision on an image is in force, and an undo (`Decision.undo`) takes back only
its reviewer's own decision, and only while that one is still in force; an undo recorded over a later
decision by someone else (two servers racing, or a line written by hand) changes nothing.
`key` is the image's request's own idempotency key, as results.csv's `idempotency_key` shows it (a
redone image, variant 2 or later, has a key of its own), and `variant` repeats its variant number.
Where they live: on `record_decision`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Final, Literal, get_args

from imagebatch.storage.backend import Backend
from imagebatch.storage.bounded import BadLine
from imagebatch.storage.location import json_object

DecisionKind = Literal["approved", "rejected", "cleared", "comment", "not_chosen", "rated"]
DECISIONS: tuple[str, ...] = get_args(DecisionKind)
COMMENT = "comment"
"""A note without a decision (the review page saves one typed on a card not yet decided): it is in force
only where no approval or rejection is (never over one), is never undone by `u`, and is not a decision
(`decided` leaves it out), so no redo or export acts on it. A later `a` or `r` on the card carries its
text as the decision's note, so a redo's edit carries it only once the card is rejected."""
NOT_CHOSEN = "not_chosen"
"""Judged, and another image it was shown among picked (the review page's `p`): not rejected, so nothing
redoes it, and not approved, so `export --approved-only` leaves it out."""
RATED: Final = "rated"
"""A star rating, 1 to 5 (`Decision.stars`; the review page's keys 1-5), beside the decision, never one:
it is never in force (`History.stars` keeps the latest per image, whoever gave it: as for decisions, the
last one counts), never undone by `u`, and neither redo nor export's choice acts on it; export.csv and
`imagebatch.results()` show it (`stars`). A reader of an older version skips its line (a kind it does
not know), so the record stays readable by both."""
STARS = range(1, 6)
"""The ratings a line may hold; a line of another (0, 6, "5", 1e9, true) is not read (`from_json`)."""
NOT_DECIDED = ("cleared", COMMENT)
"""The kinds in force on an image that is not decided."""
MAX_NOTE = 2000
"""The longest note, in characters: the review page's cap, and the reader's (`parse_line`). A stored
note longer than this was not written by the page; it is never read, so a redo never sends it."""
logger = logging.getLogger("imagebatch.review")


@dataclass(frozen=True, slots=True)
class Decision:
    """One reviewer's decision on one image."""

    key: str
    """The idempotency key of the image's request (results.csv's `idempotency_key`)."""
    variant: int
    decision: DecisionKind
    note: str = ""
    reviewer: str = ""
    at: str = ""
    """When it was made: ISO 8601 in UTC (`now()` if left empty when recorded)."""
    undo: bool = False
    """It takes back this reviewer's own decision in force on the image (the review page's `u`); its
    `decision` and `note` repeat what that brings back into force (`cleared` if nothing), for a reader
    of the line, but `History` is what applies it. Written only when true."""
    batch: str = ""
    """The bulk approve it is part of (the page's id for it): one `u` takes back the whole batch, before a
    reload and after (`History.undo_batch`). Written only when set."""
    stars: int = 0
    """A rating's stars (`RATED`: 1 to 5); 0 on every other kind. Written only when set."""

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Decision | None:
        """The decision a stored line holds, or None for a line that is not one (skipped by readers)."""
        key, decision, variant = data.get("key"), data.get("decision"), data.get("variant", 1)
        if not isinstance(key, str) or not key or decision not in DECISIONS:
            return None
        if not isinstance(variant, int) or isinstance(variant, bool) or variant < 1:
            return None
        note, reviewer, at = (data.get(name, "") for name in ("note", "reviewer", "at"))
        if not all(isinstance(text, str) for text in (note, reviewer, at)):
            return None
        batch, stars = data.get("batch", ""), data.get("stars", 0)
        if decision == RATED and (type(stars) is not int or stars not in STARS):
            return None  # a hostile or damaged rating: 0, 6, "5", 1e9, true
        return cls(
            key, variant, decision, note, reviewer, at,  # type: ignore[arg-type]
            data.get("undo") is True and decision != RATED, batch if isinstance(batch, str) else "",
            stars if decision == RATED else 0,  # type: ignore[arg-type]
        )  # fmt: skip


def now() -> str:
    """The current time as a decision records it."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def record_decision(location: Backend, decision: Decision) -> Decision:
    """Append `decision` to the location's review record (durable when this returns); returns it as
    stored (with its time filled in).

    Where they live:
    - a local folder: `review.jsonl`, one JSON line per decision, each appended whole under an exclusive
      `flock` and synced before the call returns; a line cut short by a crash is skipped by readers;
    - an object store (no append): one object per decision, `review/<time>-<random>.json`, created only if
      absent; listing gives the order (the time in UTC to the microsecond, then the random part).
    """
    return record_named(location, decision)[0]


def record_named(location: Backend, decision: Decision) -> tuple[Decision, str]:
    """`record_decision`, and the name of the object it made ("" in a folder), so that a reader that
    keeps the objects it has read (`report.review_data.DecisionCache`) need not list them to find it."""
    if decision.decision not in DECISIONS:
        raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, not {decision.decision!r}")
    if (decision.decision == RATED) != (decision.stars in STARS):
        raise ValueError(f"a rating has 1 to 5 stars, and only a rating has any, not {decision.stars!r}")
    if len(decision.note) > MAX_NOTE:  # a reader would refuse the line (`parse_line`)
        raise ValueError(f"a note is at most {MAX_NOTE:,} characters, not {len(decision.note):,}")
    if not decision.at:
        decision = Decision(**{**asdict(decision), "at": now()})
    stamp = decision.at.replace(":", "").replace("-", "")
    return decision, location.add_decision(decision_line(decision), stamp)


def decision_line(decision: Decision) -> bytes:
    """A decision as the line (or object) that records it."""
    data = asdict(decision)
    if not decision.undo:
        del data["undo"]  # the usual line stays as it was
    if not decision.batch:
        del data["batch"]
    if not decision.stars:
        del data["stars"]
    return (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


_REFUSED: set[tuple[str, int]] = set()
"""The lines refused so far (where, the note's length), each said once: a run reads the record three
times (its redo, its report, its Prefect artifact), the review server once per line."""


def parse_line(raw: bytes, where: str) -> Decision | None:
    """The decision a stored line (or object) holds, or None: a line that is not a decision (one a crash
    cut short, say) is skipped quietly; one whose note is longer than `MAX_NOTE` is refused, with one
    warning line naming `where` (the file and line, or the object).

    Refused, the line counts for nothing, as a torn one: the decision before it stays in force, and
    its note is never sent (a redo's edit instruction comes from the decision in force). Refusing every
    read of the record instead would stop a run's report and the review page too, for one line. Each
    refused line is said once per process (`_REFUSED`)."""
    data = json_object(raw)
    decision = None if data is None else Decision.from_json(data)
    if decision is not None and len(decision.note) > MAX_NOTE:
        if (where, len(decision.note)) in _REFUSED:
            return None
        _REFUSED.add((where, len(decision.note)))
        logger.warning(
            "%s: a note of %s characters, longer than the review page's %s: the decision is not read",
            where, f"{len(decision.note):,}", f"{MAX_NOTE:,}",
        )  # fmt: skip
        return None
    return decision


def iter_decisions(location: Backend, bad: BadLine | None = None) -> Iterator[Decision]:
    """Every decision recorded in `location`, oldest first (lines that are not decisions skipped, those
    with an over-long note refused: `parse_line`; with `bad`, told the number of each line skipped, one
    over `storage.bounded`'s line bound too, which without `bad` is refused: `RecordError`)."""
    for number, where, chunk in location.decision_lines(bad):
        if (decision := parse_line(chunk, where)) is not None:
            yield decision
        elif bad is not None:
            bad(number)


def read_decisions(location: Backend) -> dict[str, Decision]:
    """The decision in force for each image key, the record replayed (`History`): a `cleared` one
    included, so a caller sees that an image was reviewed then undone; `decided()` drops those."""
    return dict(replayed(location).in_force)


def read_stars(location: Backend) -> dict[str, int]:
    """The stars each rated image has now (the latest rating, whoever gave it: `History.stars`)."""
    return {key: rating.stars for key, rating in replayed(location).stars.items()}


def replayed(location: Backend) -> History:
    """The location's whole record replayed (`History`)."""
    history = History()
    for decision in iter_decisions(location):
        history.apply(decision)
    return history


def decided(location: Backend) -> dict[str, Decision]:
    """The images approved or rejected now (the last decision, unless it was `cleared` or a comment)."""
    return {key: d for key, d in read_decisions(location).items() if d.decision not in NOT_DECIDED}


UNDO_DEPTH = 200
"""How far back a reloaded review page can undo."""


class History:
    """The review record replayed in order: for each image, the decisions that stand one upon another
    (an undo takes the top one off), and the one in force (the top; after an undo that emptied the
    image, the undo itself, as `cleared`).

    An undo applies only when the top decision is its reviewer's own: one reviewer's undo never brings
    back an earlier decision over another's later one. `refusal` says why an undo would not apply.
    A comment (`COMMENT`) stands apart: in force where nothing else is, back in force when an undo
    empties the image. A rating (`RATED`) stands apart too, in `stars`."""

    def __init__(self) -> None:
        self.in_force: dict[str, Decision] = {}
        self.stars: dict[str, Decision] = {}
        """The latest rating of each rated image (`RATED`)."""
        self._standing: dict[str, list[tuple[int, Decision]]] = {}
        self._comments: dict[str, Decision] = {}
        self._count = 0

    def apply(self, decision: Decision) -> bool:
        """Replay one recorded decision; False for an undo that takes nothing back (not in force)."""
        self._count += 1
        if decision.decision == RATED:
            self.stars[decision.key] = decision
            return True
        if decision.decision == COMMENT and not decision.undo:
            self._comments[decision.key] = decision
            top = self.in_force.get(decision.key)
            if top is None or top.decision in NOT_DECIDED:
                self.in_force[decision.key] = decision
            return True
        standing = self._standing.setdefault(decision.key, [])
        if not decision.undo:
            standing.append((self._count, decision))
            self.in_force[decision.key] = decision
            return True
        if self.refusal(decision.key, decision.reviewer) is not None:
            return False
        standing.pop()
        emptied = self._comments.get(decision.key) or replace(decision, decision="cleared", note="")
        self.in_force[decision.key] = standing[-1][1] if standing else emptied
        return True

    def refusal(self, key: str, reviewer: str, batch: str | None = None) -> str | None:
        """Why `reviewer` cannot undo on `key` now (one line), or None: their decision is in force (with
        `batch`, their decision of that bulk approve)."""
        standing = self._standing.get(key, [])
        if not any(d.reviewer == reviewer for _, d in standing):
            return "nothing of yours to undo on this image (undone already)"
        top = standing[-1][1]
        if top.reviewer != reviewer:
            said = f"{top.decision}{f': {top.note}' if top.note else ''}"
            return f"{top.reviewer or 'another reviewer'} decided it since you did ({said}), and that stands"
        if batch is not None and top.batch != batch:
            return "you decided it again since the bulk approve: undo that first"
        return None

    def undo(self, key: str, reviewer: str, batch: str = "") -> Decision:
        """The undo line that takes back `reviewer`'s decision in force on `key` (check `refusal` first):
        it repeats what comes back into force."""
        standing = self._standing[key]
        back = standing[-2][1] if len(standing) > 1 else self._comments.get(key)
        top = standing[-1][1]
        kind, note = (back.decision, back.note) if back is not None else ("cleared", "")
        return Decision(key, top.variant, kind, note, reviewer, undo=True, batch=batch)

    def batch_keys(self, batch: str, reviewer: str) -> list[str]:
        """The images `reviewer`'s bulk approve `batch` decided that are not yet undone, the last first
        (the order their undos are recorded in)."""
        found = {
            key: n
            for key, standing in self._standing.items()
            for n, d in standing
            if d.batch == batch and d.reviewer == reviewer
        }
        return sorted(found, key=found.__getitem__, reverse=True)

    def undo_stack(self, reviewer: str, depth: int = UNDO_DEPTH) -> list[tuple[str, str]]:
        """What `reviewer` can still try to undo, oldest first: (key, the bulk approve it was part of or
        ""), their decisions not yet undone, in the record's order (one another reviewer has decided
        over is there too: its undo is refused, and says why)."""
        mine = sorted(
            (n, d.key, d.batch)
            for standing in self._standing.values()
            for n, d in standing
            if d.reviewer == reviewer
        )
        return [(key, batch) for _, key, batch in mine[-depth:]]

    def opinions(self, key: str) -> list[Decision]:
        """Each reviewer's own decision still standing on `key` (their latest, unless undone), in the
        record's order: two reviewers who disagree are both here, whichever of them is in force."""
        latest: dict[str, tuple[int, Decision]] = {}
        for n, decision in self._standing.get(key, []):
            latest[decision.reviewer] = (n, decision)
        return [decision for _, decision in sorted(latest.values(), key=lambda pair: pair[0])]
