"""A reviewer's decisions on a run's images: approved, rejected (with a note), or cleared (undone).

Decisions are appended, never rewritten, so two reviewers (two browsers, or two `imagebatch review`
servers on one output location) lose nothing of each other's; the last decision for an image wins.
`key` is the image's request's own idempotency key, as results.csv's `idempotency_key` shows it (a
redone image, variant 2 or later, has a key of its own), and `variant` repeats its variant number.
Where they live: on `record_decision`.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Literal, get_args

from imagebatch.storage.bounded import BadLine, split_lines
from imagebatch.storage.layout import REVIEW_FILE, REVIEW_PREFIX
from imagebatch.storage.location import LocalFolder, Location, confined, json_object

DecisionKind = Literal["approved", "rejected", "cleared"]
DECISIONS: tuple[str, ...] = get_args(DecisionKind)


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
    """It takes back this reviewer's last decision on the image (the review page's `u`), so that a page
    loaded later can undo further back (`undo_stack`). Written only when true."""
    batch: str = ""
    """The bulk approve it is part of (the page's id for it): one `u` takes back the whole batch, before a
    reload and after. Written only when set."""

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
        batch = data.get("batch", "")
        return cls(
            key, variant, decision, note, reviewer, at,  # type: ignore[arg-type]
            data.get("undo") is True, batch if isinstance(batch, str) else "",
        )  # fmt: skip


def now() -> str:
    """The current time as a decision records it."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def record_decision(location: Location, decision: Decision) -> Decision:
    """Append `decision` to the location's review record (durable when this returns); returns it as
    stored (with its time filled in).

    Where they live:
    - a local folder: `review.jsonl`, one JSON line per decision, each appended whole under an exclusive
      `flock` and synced before the call returns; a line cut short by a crash is skipped by readers;
    - an object store (no append): one object per decision, `review/<time>-<random>.json`, created only if
      absent; listing gives the order (the time in UTC to the microsecond, then the random part).
    """
    if decision.decision not in DECISIONS:
        raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, not {decision.decision!r}")
    if not decision.at:
        decision = Decision(**{**asdict(decision), "at": now()})
    line = _line(decision)
    if isinstance(location, LocalFolder):
        _append(location, line)
    else:
        stamp = decision.at.replace(":", "").replace("-", "")
        while not location.put_new(f"{REVIEW_PREFIX}{stamp}-{secrets.token_hex(6)}.json", line):
            pass  # a name already taken (vanishingly rare): draw another random part
    return decision


def _line(decision: Decision) -> bytes:
    data = asdict(decision)
    if not decision.undo:
        del data["undo"]  # the usual line stays as it was
    if not decision.batch:
        del data["batch"]
    return (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _append(folder: LocalFolder, line: bytes) -> None:
    folder.root.mkdir(parents=True, exist_ok=True)
    # review.jsonl linked out of OUT must not receive the decisions (issue 29 #9): refused, and a link
    # made in its place after the check fails the open (O_NOFOLLOW).
    path = confined(folder.root, REVIEW_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # A line a crash cut short must not glue onto this one: start on a fresh line if needed.
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock


def iter_decisions(location: Location, bad: BadLine | None = None) -> Iterator[Decision]:
    """Every decision recorded in `location`, oldest first (lines that are not decisions skipped; with
    `bad`, told the number of each, a line over `storage.bounded`'s bound too)."""
    if isinstance(location, LocalFolder):
        where = f"{location.url}/{REVIEW_FILE}"
        chunks: Iterable[tuple[int, bytes | None]] = split_lines(location.get(REVIEW_FILE) or b"", where, bad)
    else:  # one object per decision, read a few at a time, in the listing's order
        with ThreadPoolExecutor(max_workers=16) as pool:
            chunks = list(enumerate(pool.map(location.get, location.list(REVIEW_PREFIX)), 1))
    for number, chunk in chunks:
        data = None if chunk is None else json_object(chunk)
        if data is not None and (decision := Decision.from_json(data)) is not None:
            yield decision
        elif bad is not None and chunk is not None:
            bad(number)


def read_decisions(location: Location) -> dict[str, Decision]:
    """The decision in force for each image key: the last one recorded (a `cleared` one included, so
    a caller sees that an image was reviewed then undone; `decided()` drops those)."""
    return {decision.key: decision for decision in iter_decisions(location)}


def decided(location: Location) -> dict[str, Decision]:
    """The images approved or rejected now (the last decision, unless it was `cleared`)."""
    return {key: d for key, d in read_decisions(location).items() if d.decision != "cleared"}


UNDO_DEPTH = 200
"""How far back a reloaded review page can undo."""


def undo_stack(
    history: Iterable[Decision], reviewer: str, depth: int = UNDO_DEPTH
) -> list[tuple[str, Decision | None, str]]:
    """What `reviewer` can still undo, oldest first: (key, the decision in force before theirs or None,
    the bulk approve it was part of or ""), replayed from the record (`history`, oldest first): each
    decision of theirs pushes, each of their undos (`Decision.undo`) takes back the last one pushed."""
    in_force: dict[str, Decision] = {}
    stack: list[tuple[str, Decision | None, str]] = []
    for decision in history:
        if decision.reviewer == reviewer:
            if not decision.undo:
                stack.append((decision.key, in_force.get(decision.key), decision.batch))
            elif stack and stack[-1][0] == decision.key:
                stack.pop()
        in_force[decision.key] = decision
    return stack[-depth:]
