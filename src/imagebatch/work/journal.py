"""The write-ahead journal and the usage ledger of an output location: an attempt is journaled (and made
durable) before it is sent, its outcome after; one usage line per HTTP attempt. A folder appends to
`journal.jsonl` and `usage.jsonl` (a shard to its own files); an object store writes both as lines of the
journal's segments (`storage.segments`), usage lines marked `"event": "usage"`.

What is synced when is the protocol's cost and its safety: each rule is written next to its reason.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from imagebatch.storage import layout
from imagebatch.storage.appendlog import AppendLog, json_line, read_jsonl
from imagebatch.storage.bounded import BadLine
from imagebatch.work.holds import NO_FOLDER, Holds
from imagebatch.work.request_record import RequestRecord


class Journal:
    """The journal and usage ledger of one output store, written under `holds` (an object store's
    segments exist only while the store holds its prefix)."""

    def __init__(self, holds: Holds, log: AppendLog, shard: str | None) -> None:
        self.holds, self.log = holds, log
        base = holds.folder or NO_FOLDER
        self.journal_path = base / layout.jsonl(layout.JOURNAL, shard)
        self.usage_path = base / layout.jsonl(layout.USAGE_LEDGER, shard)

    def write(self, event: str, *, sync: bool = True, **fields: Any) -> None:
        """Append an event to the write-ahead journal and make it durable before returning.

        `sync=False` for a line a synced one will cover before it matters: the next fsync of the journal
        (any thread's) covers every line written before it, and `sync` at the end of a run covers the
        rest. A success's `attempt_finished` is followed by its synced `answered`, and its `outcome` only
        repeats what `answered` and the files on disk already say; each fsync saved is 1-4 ms of a request
        thread's time between answer and next send (bench/README.md "Throughput")."""
        if self.holds.folder is None:
            self._append_segment({"event": event, **fields}, sync=sync)
            return
        self.log.append(self.journal_path, {"event": event, **fields}, sync=sync)

    def _append_segment(self, record: dict[str, Any], *, sync: bool) -> None:
        """An object store's journal line: into the next segment; with `sync`, once that segment is in."""
        with self.holds.watch.writing():
            if self.holds.segments is None:
                where = self.holds.location.url
                raise OSError(errno.EIO, f"{where} is not held by this run: nothing can be journaled")
            self.holds.segments.append(json_line(record), sync)

    def record_outcome(self, record: RequestRecord) -> None:
        """Journal a request's outcome; a success's needs no fsync of its own (its synced `answered` and
        its files already make it done on replay, see `work.replay`)."""
        self.write("outcome", sync=record.status != "succeeded", **asdict(record))

    def sync(self) -> None:
        """Make every line appended so far durable (the journal's and usage's unsynced lines).

        In an object store, a run holding the prefix alone then compacts the journal into one object (the
        end of a run is the one caller), so that a rerun reads one object, not every segment."""
        if self.holds.folder is None:
            if (segments := self.holds.segments) is not None:
                with self.holds.watch.writing():
                    segments.sync()
                    if self.holds.shard is None:
                        segments.compact()
            return
        for path in (self.journal_path, self.usage_path):
            self.log.sync(path)

    def append_usage(self, record: dict[str, Any]) -> None:
        if self.holds.folder is None:
            self._append_segment({"event": "usage", **record}, sync=False)
            return
        self.log.append(self.usage_path, record, sync=False)

    def usage_lines(self, bad: BadLine | None = None) -> Iterator[dict[str, Any]]:
        """The usage ledger: one line per HTTP attempt, every run into the location. With `bad`, told of
        each line skipped as bad (`storage.bounded`); without, a line over the bound is refused."""
        if self.holds.folder is not None:
            yield from read_jsonl(self.usage_path, bad)
            return
        for ev in self.events(bad):
            if ev.pop("event", None) == "usage":
                yield ev

    def events(self, bad: BadLine | None = None) -> Iterator[dict[str, Any]]:
        """The journal's lines in order (the folder's journal, then the shards' not yet merged)."""
        if (root := self.holds.folder) is None:
            from imagebatch.storage.segments import read_journal

            yield from read_journal(self.holds.objects(), bad)
            return
        for path in [
            root / layout.jsonl(layout.JOURNAL),
            *sorted(root.glob(layout.shard_jsonl(layout.JOURNAL))),
        ]:
            yield from read_jsonl(path)
