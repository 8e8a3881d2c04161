"""The decisions in force on a review's images, and their ratings, kept current without reading the whole
record again (`DecisionCache`), and a decision as the page reads it (`decision_json`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from imagebatch.storage.backend import Backend
from imagebatch.work.decisions import Decision, History, decision_line, parse_line, record_named


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
