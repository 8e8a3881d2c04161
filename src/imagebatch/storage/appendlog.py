"""Append-only JSON Lines files in a local folder (the journal, the usage ledger, the conversations): one
line at a time, made durable together (group commit), and read back without a line a crash cut short.

Its own module because the durability rules (a torn tail ended before the next line, one fsync covering
every line written before it) hold for every appended file, whatever the file records.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from imagebatch.storage.bounded import BadLine, record_lines
from imagebatch.storage.location import confined, json_object


def last_byte(path: Path) -> bytes:
    with path.open("rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1)


def read_jsonl(path: Path, bad: BadLine | None = None) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects of a JSON Lines file, skipping a final line cut short by a crash, and a line
    that is not a JSON object. Read with `storage.bounded.record_lines`'s bounds: with `bad`, a line
    over the bound is skipped too, and `bad` is told the number of each line skipped."""
    for number, raw in record_lines(path, bad):
        if (obj := json_object(raw)) is not None:
            yield obj
        elif bad is not None:
            bad(number)


def append_synced(target: Path, lines: list[bytes]) -> None:
    """Append whole lines to `target` and fsync it, ending a torn last line first."""
    with target.open("ab") as fh:
        if fh.tell() and last_byte(target) != b"\n":
            fh.write(b"\n")
        fh.write(b"".join(lines))
        fh.flush()
        os.fsync(fh.fileno())


def json_line(record: dict[str, Any]) -> bytes:
    """One record as a compact JSON line."""
    return (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()


class WriteWatch:
    """The first write to an output location that failed (a full disk, ...), and who is told of it: a run
    stops dispatching at it."""

    def __init__(self) -> None:
        self.error: OSError | None = None
        self.on_error: Callable[[OSError], None] | None = None

    def note(self, exc: OSError) -> None:
        if self.error is None:
            self.error = exc
            if self.on_error is not None:
                self.on_error(exc)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Note a failed write; the error goes on to the caller."""
        try:
            yield
        except OSError as exc:
            self.note(exc)
            raise


class AppendLog:
    """Appends lines to local files, safe to share between threads; `watch` is told of a failed write."""

    def __init__(self, watch: WriteWatch) -> None:
        self.watch = watch
        self._lock = threading.Lock()
        self._tail_checked: set[Path] = set()
        self.written: dict[Path, int] = {}
        """Lines appended to each file by this log."""
        self._synced: dict[Path, int] = {}
        """Of those, how many an fsync that started after them has covered."""
        self._sync_locks: dict[Path, threading.Lock] = {}

    def append(self, path: Path, record: dict[str, Any], *, sync: bool) -> None:
        """Append one line; with `sync`, return only once it is on disk.

        Lines are written one at a time (under the lock), but synced together: a thread whose line an
        fsync already covers returns without its own (group commit). The fsync runs outside the lock,
        so a run's request threads do not queue behind each other's disk waits (one fsync per line
        under one lock was most of a 64-thread run's waiting)."""
        line = json_line(record)
        try:
            # Never through a link out of the folder it belongs to.
            with self.watch.writing(), confined(path.parent, path.name).open("ab") as fh:
                with self._lock:
                    if path not in self._tail_checked:
                        # A line torn by a crash has no newline: end it, or this record would be glued
                        # onto it and lost with it when the file is read.
                        self._tail_checked.add(path)
                        if fh.tell() and last_byte(path) != b"\n":
                            line = b"\n" + line
                    fh.write(line)
                    fh.flush()
                    written = self.written[path] = self.written.get(path, 0) + 1
                if sync:
                    self._sync_through(path, fh, written)
        except OSError:
            self._tail_checked.discard(path)  # a partial line may be left: end it before the next one
            raise

    def _sync_through(self, path: Path, fh: BinaryIO, written: int) -> None:
        """Make `path`'s first `written` lines durable, unless an fsync already did (group commit)."""
        with self._lock:
            syncing = self._sync_locks.setdefault(path, threading.Lock())
        with syncing:
            if self._synced.get(path, 0) < written:
                upto = self.written[path]  # every line counted here was written before the fsync
                os.fsync(fh.fileno())  # of the file: the lines other threads wrote are synced too
                self._synced[path] = upto

    def sync(self, path: Path) -> None:
        """Make every line appended to `path` so far durable."""
        with self._lock:
            written = self.written.get(path, 0)
        if self._synced.get(path, 0) < written:
            with path.open("ab") as fh:
                self._sync_through(path, fh, written)
