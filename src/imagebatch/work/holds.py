"""Who may write into an output location: a run holds it alone, the shards of a sharded run share it
(each holding its own shard alone). A local folder is held by `flock`; an object store by a lease
(`storage.lease`), under which the journal's segments are written (`segments`).

One class so that the folder's and the object store's forms of each hold sit side by side: a rule
changed for one is seen to need the same change for the other.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from imagebatch.storage import layout
from imagebatch.storage.appendlog import WriteWatch, append_synced
from imagebatch.storage.bounded import record_lines
from imagebatch.storage.location import Location, OutputLockedError

if TYPE_CHECKING:
    from imagebatch.storage.lease import Lease
    from imagebatch.storage.objectstore import ObjectLocation
    from imagebatch.storage.segments import SegmentJournal

NO_FOLDER = Path("/dev/null/imagebatch-object-store")
"""The base of an object store's local paths: never used; a stray local write there fails at once."""
RUN = "another imagebatch run"
"""Who holds a location held alone, as a refusal names it."""


class Holds:
    """The holds of one output store: `folder` for a local folder (None: `location` is an object store)."""

    def __init__(
        self,
        location: Location,
        folder: Path | None,
        shard: str | None,
        watch: WriteWatch,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.location, self.folder, self.shard, self.watch, self.clock = location, folder, shard, watch, clock
        self.segments: SegmentJournal | None = None
        """An object store's journal while this run holds the prefix."""
        self.lease: Lease | None = None

    @property
    def root(self) -> Path:
        if self.folder is None:
            raise TypeError(f"{self.location.url} is an object store, not a local folder")
        return self.folder

    def objects(self) -> ObjectLocation:
        from imagebatch.storage.objectstore import ObjectLocation

        assert isinstance(self.location, ObjectLocation)
        return self.location

    @contextlib.contextmanager
    def _flock(self, name: str, mode: int, what: str) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / name).open("a") as fh:
            try:
                fcntl.flock(fh.fileno(), mode | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputLockedError(f"{what} is using {self.root}") from None
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def hold_and_merge(self) -> Iterator[None]:
        """Hold the output folder for one run: a second run into it at the same time would send twice.

        A shard of a sharded run holds it shared (`shard_hold`), so no run holds it alone while a shard
        runs. Holding it alone, the journals and usage files shards left (a sharded run that was killed
        before it merged them) are merged first: every later line goes after theirs.

        In an object store, the lease (`storage.lease.Lease`) is held instead, renewed in the background;
        the journal's segments are written under it. A store that holds it already (a sharded run's
        parent, `hold_sharded`) goes on holding it."""
        if self.folder is None:
            if self.lease is not None:
                yield
                return
            with self._leased(RUN):
                yield
            return
        with self._flock(layout.LOCK, fcntl.LOCK_EX, RUN):
            self.merge_shards()
            yield

    @contextlib.contextmanager
    def hold_sharded(self, shards: int) -> Iterator[None]:
        """Hold the location for the parent of a sharded run, from its start to its end.

        An object store's prefix: its lease, marked with the number of shards, held throughout (the shards
        write under it, each holding its own shard lease: `shard_hold`; a run that is not sharded is
        refused); the parent's `hold_and_merge` inside it holds nothing more. A local folder: nothing here
        (its parent holds the folder alone, `hold_and_merge`, at its start and at its end, and its shards
        hold it shared meanwhile)."""
        if self.folder is not None:
            yield
            return
        with self._leased(RUN, shards=shards):
            yield

    @contextlib.contextmanager
    def _leased(self, what: str, shards: int | None = None) -> Iterator[None]:
        from imagebatch.storage.lease import Lease
        from imagebatch.storage.segments import JOURNAL, SegmentJournal, next_run

        loc = self.objects()
        lease = Lease(loc, what, clock=self.clock, on_lost=self.watch.note, shards=shards)
        lease.acquire()
        try:
            lease.start()
            self.lease = lease
            self.segments = SegmentJournal(loc, next_run(loc.list(JOURNAL)), fence=lease.check)
            yield
        finally:
            self.segments = self.lease = None
            lease.release()

    @contextlib.contextmanager
    def shard_hold(self) -> Iterator[None]:
        """Hold the folder as one shard: shared with the other shards of the run, alone for this shard.

        In an object store: this shard's own lease, under its parent's lease on the prefix
        (`storage.lease.ParentLease`); its segments, `journal/<run>-<I-of-N>-<seq>.jsonl`, are written
        only while both are held."""
        if self.folder is None:
            with self._shard_leased():
                yield
            return
        with (
            self._flock(layout.LOCK, fcntl.LOCK_SH, "a run that is not sharded"),
            self._flock(layout.shard_lock(str(self.shard)), fcntl.LOCK_EX, f"shard {self.shard}"),
        ):
            yield

    @contextlib.contextmanager
    def _shard_leased(self) -> Iterator[None]:
        from imagebatch.storage.lease import Lease, ParentLease
        from imagebatch.storage.segments import JOURNAL, SegmentJournal, next_run

        loc, shard = self.objects(), str(self.shard)
        lease = Lease(
            loc, f"shard {shard}", name=layout.shard_lease(shard), clock=self.clock, on_lost=self.watch.note
        )
        lease.acquire()
        try:
            parent = ParentLease(loc, shard, clock=self.clock)  # refused unless its sharded run holds it
            lease.start()

            def fence() -> None:
                lease.check()
                parent.check()

            self.lease = lease
            self.segments = SegmentJournal(loc, next_run(loc.list(JOURNAL)), shard=shard, fence=fence)
            yield
        finally:
            self.segments = self.lease = None
            lease.release()

    def in_use(self) -> str | None:
        """Who is sending into the location now (a run, or a shard of one), or None: tested without
        holding anything. A folder's locks are each tried shared and non-blocking, and let go at once (a
        run holds its lock alone, a shard its own); a lock file never made means no run ever held it, and
        none is made. An object store's lease object is read (`storage.lease.lease_holder`)."""
        if self.folder is None:
            from imagebatch.storage.lease import lease_holder

            return lease_holder(self.objects(), self.clock)
        names = [layout.LOCK, *(p.name for p in self.root.glob(layout.shard_lock("*")))]
        for name in names:
            try:
                fd = os.open(self.root / name, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return "a shard of a sharded run" if name != layout.LOCK else RUN
            finally:
                os.close(fd)  # lets go of the shared lock, if it was taken
        return None

    def shard_held(self, shard: str) -> bool:
        """Whether a process holds shard `shard`'s lock now (a shard's process holds it while it sends);
        in an object store, whether its shard lease is live."""
        if self.folder is None:
            from imagebatch.storage.lease import live_lease

            return live_lease(self.objects(), layout.shard_lease(shard), self.clock) is not None
        try:
            with self._flock(layout.shard_lock(shard), fcntl.LOCK_EX, f"shard {shard}"):
                return False
        except OutputLockedError:
            return True

    def merge_shards(self) -> int:
        """Append the shards' journal and usage lines to the folder's own files, synced, then remove the
        shards' files (only while the folder is held alone: no shard is writing). Returns the lines
        merged. A crash between the append and the removal merges them twice next time: a key's events
        repeat, which only counts its attempts twice."""
        merged = 0
        if self.folder is None:
            return merged
        for kind in (layout.JOURNAL, layout.USAGE_LEDGER):
            for part in sorted(self.root.glob(layout.shard_jsonl(kind))):
                merged += _append_part(self.root / layout.jsonl(kind), part)
                part.unlink()
        return merged


MERGE_BATCH_BYTES = 4 << 20
"""A shard's lines appended to the folder's file this many bytes at a time: a shard's file is never read
whole."""


def _append_part(target: Path, part: Path) -> int:
    """Append the complete lines of `part` (each within the bound) to `target`, a batch at a time, each
    batch synced; the lines appended. A crash between batches leaves a prefix appended, and the whole
    part merged again next time: as a crash before the removal, a key's events repeat."""
    batch: list[bytes] = []
    size = merged = 0
    for _, line in record_lines(part):
        batch.append(line)
        size += len(line)
        merged += 1
        if size >= MERGE_BATCH_BYTES:
            append_synced(target, batch)
            batch, size = [], 0
    if batch:
        append_synced(target, batch)
    return merged
