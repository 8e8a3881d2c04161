"""The journal in an object store, as append-only segments: one create-only object per group commit,
`journal/<run>-[<shard>-]<seq>.jsonl` (zero-padded: listing gives the order), compacted into one object at
a run's end. Each write is fenced by the run's lease (`storage.lease`): a run that may no longer write
(its lease lost or about to expire) writes nothing.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from imagebatch.storage import layout
from imagebatch.storage.bounded import MAX_RECORD_LINE_BYTES, BadLine, refused
from imagebatch.storage.location import json_object
from imagebatch.storage.objectstore import ObjectLocation, StoreError

JOURNAL = layout.JOURNAL_SEGMENTS


def _run_of(name: str) -> int:
    """The run number of a journal object's name (`journal/00000003-...`), or -1 for a stranger."""
    stem = name.removeprefix(JOURNAL)
    return int(stem[:8]) if stem[:8].isdigit() else -1


def journal_objects(names: list[str]) -> list[str]:
    """The journal objects a reader replays, in order: the latest compaction, then every segment of a
    later run (a compaction holds every earlier line; segments it left behind, by a crash before they
    were deleted, are ignored)."""
    names = [n for n in names if n.endswith(".jsonl") and _run_of(n) >= 0]
    compacts = [n for n in names if n.endswith("-compact.jsonl")]
    if not compacts:
        return names
    last = max(compacts, key=_run_of)
    return [last] + [n for n in names if _run_of(n) > _run_of(last)]


def next_run(names: list[str]) -> int:
    """The number of a new run's segments: one past every run the journal holds."""
    return max((_run_of(n) for n in names), default=0) + 1


def stream_lines(
    chunks: Iterable[bytes], where: object, bad: BadLine | None = None
) -> Iterator[tuple[int, bytes]]:
    """The numbered lines of an object read as a stream of chunks, each line whole and within
    `MAX_RECORD_LINE_BYTES` (a longer one is read past: `bad` told its number, or without `bad` refused);
    a last line without its newline is kept, as `split_lines` keeps it. Memory holds a chunk and a line."""
    rest, number, skipping = b"", 0, False
    for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for raw in lines:
            number += 1
            if skipping or len(raw) >= MAX_RECORD_LINE_BYTES:
                skipping = False
                _too_long(where, number, bad)
            else:
                yield number, raw
        if len(rest) >= MAX_RECORD_LINE_BYTES:  # never held whole: what is left of it is skipped
            skipping, rest = True, b""
    if skipping or len(rest) >= MAX_RECORD_LINE_BYTES:
        _too_long(where, number + 1, bad)
    elif rest:
        yield number + 1, rest


def _too_long(where: object, number: int, bad: BadLine | None) -> None:
    if bad is None:
        raise refused(where, f"has a line over {MAX_RECORD_LINE_BYTES:,} bytes (line {number:,})")
    bad(number)


def journal_chunks(loc: ObjectLocation, names: list[str]) -> Iterator[tuple[str, Iterable[bytes]]]:
    """Each journal object's bytes, in order, as (name, chunks), each object ending with a newline: the
    compaction streamed, the segments fetched in parallel a window at a time. An object removed since
    the listing (by a compaction) is skipped: its lines are in the compaction."""
    head = names[:1] if names and names[0].endswith("-compact.jsonl") else []
    for name in head:
        if (chunks := loc.get_stream(name)) is not None:
            yield name, _ended(chunks)
    rest = names[len(head) :]
    for name, blob in zip(rest, loc.iter_many(rest), strict=True):
        if blob:
            yield name, (blob if blob.endswith(b"\n") else blob + b"\n",)


def _ended(chunks: Iterable[bytes]) -> Iterator[bytes]:
    last = b"\n"
    for chunk in chunks:
        if chunk:
            last = chunk[-1:]
            yield chunk
    if last != b"\n":
        yield b"\n"


def read_journal(loc: ObjectLocation, bad: BadLine | None = None) -> Iterator[dict[str, Any]]:
    """Every line of the journal (and the usage lines it carries), in order, never the whole of it in
    memory: the compaction read as a stream, segments a window at a time."""
    for name, chunks in journal_chunks(loc, journal_objects(loc.list(JOURNAL))):
        where = f"{loc.url}/{name}"
        for number, raw in stream_lines(chunks, where, bad):
            if (obj := json_object(raw)) is not None:
                yield obj
            elif bad is not None:
                bad(number)


class SegmentJournal:
    """Lines appended by a run's threads, made durable together: a thread that needs its line durable
    either finds a PUT that started after its line covered it, or PUTs every pending line as one new
    segment itself (group commit, as one fsync covers many lines in a local folder). A failed PUT fails
    every thread whose line it held: those lines are lost, as a torn write's are, and the run stops."""

    def __init__(
        self,
        loc: ObjectLocation,
        run: int,
        shard: str | None = None,
        fence: Callable[[], None] = lambda: None,
    ) -> None:
        self.loc = loc
        self.run = run
        self.shard = shard
        self.fence = fence
        """Raises (an OSError) when this run may no longer write: its lease is lost or about to expire."""
        self.puts = 0
        self._seq = 0
        self._pending: list[bytes] = []
        self._written = 0
        self._synced = 0
        self._failed: list[tuple[int, int, OSError]] = []
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()

    def append(self, line: bytes, sync: bool) -> None:
        with self._lock:
            self._pending.append(line)
            self._written += 1
            written = self._written
        if sync:
            self.sync_through(written)

    def sync(self) -> None:
        with self._lock:
            written = self._written
        self.sync_through(written)

    def sync_through(self, written: int) -> None:
        """Return once the first `written` lines are in a segment; raise if the PUT that held one failed."""
        with self._commit_lock:
            for start, end, exc in self._failed:
                if start < written <= end:
                    raise exc
            if self._synced >= written:
                return
            with self._lock:
                lines, self._pending = self._pending, []
                start, upto = self._synced, self._written
            try:
                self.fence()
                self._put(b"".join(lines))
            except OSError as exc:
                self._failed.append((start, upto, exc))
                self._synced = upto
                raise
            self._synced = upto

    def _put(self, data: bytes) -> None:
        self._seq += 1
        shard = f"{self.shard}-" if self.shard else ""
        name = f"{JOURNAL}{self.run:08d}-{shard}{self._seq:08d}.jsonl"
        self.puts += 1
        if not self.loc.put_new(name, data):
            raise StoreError(errno.EEXIST, f"{self.loc.url}/{name} exists: another run is writing here")

    def compact(self) -> None:
        """Replace every journal object with one (`<run>-compact.jsonl`, created only if absent), then
        delete the rest; later lines go to the next run number's segments. A rerun then reads one object.
        Only while the prefix is held alone."""
        self.sync()
        with self._commit_lock:
            names = journal_objects(self.loc.list(JOURNAL))
            if len(names) <= 1 and (not names or names[0].endswith("-compact.jsonl")):
                return
            self.fence()
            # Named by the highest run it holds: a sharded run's shards numbered their segments at their
            # own start, after this run took its number; segments a crash left behind are then ignored.
            self.run = max(self.run, *map(_run_of, names))
            target = f"{JOURNAL}{self.run:08d}-compact.jsonl"
            if self.loc.exists(target):
                raise StoreError(errno.EEXIST, f"{self.loc.url}/{target} exists: another run is writing here")
            # Streamed object by object as a multipart upload: memory holds a window of segments and a
            # part, never the journal (which keeps every earlier run's lines).
            self.loc.put_stream(target, (c for _, chunks in journal_chunks(self.loc, names) for c in chunks))
            self.fence()  # the upload took time: the lease must still be ours before the segments go
            self.loc.delete_many(names)
            self.run += 1
            self._seq = 0
