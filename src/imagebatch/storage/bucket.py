"""An object store's prefix as a `storage.backend.Backend`: held by a lease (`storage.lease`), its records
written as the lines of the journal's segments (`storage.segments`; usage lines marked
`"event": "usage"`), each segment only while the lease is held, and compacted at the end of a run.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import tempfile
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from imagebatch.storage import layout
from imagebatch.storage.appendlog import WriteWatch, json_line
from imagebatch.storage.bounded import BadLine
from imagebatch.storage.bucketfiles import BucketFiles
from imagebatch.storage.lease import LEASE_SECONDS, Lease, ParentLease, lease_holder, live_lease
from imagebatch.storage.location import RUN
from imagebatch.storage.objectstore import READ_THREADS, ObjectLocation
from imagebatch.storage.segments import JOURNAL, SegmentJournal, next_run, read_journal, stream_lines

USAGE_EVENT = "usage"
"""The `event` of a usage line among the journal's."""


class BucketBackend(BucketFiles):
    """One `scheme://bucket/prefix`'s record; `shard` is `I-of-N` for a shard of a sharded run, else None.
    `clock`: the wall clock the lease is timed by (tests inject one)."""

    release_wait = LEASE_SECONDS + 5.0

    def __init__(
        self,
        url: str,
        shard: str | None = None,
        *,
        clock: Callable[[], float] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, **options)
        self.shard, self.clock = shard, clock
        self.watch = WriteWatch()
        self.spool_folder = Path(tempfile.gettempdir())
        self.title = self.url
        self.segments: SegmentJournal | None = None
        """The journal while this run holds the prefix."""
        self.lease: Lease | None = None

    # -- the hold --

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """The lease, renewed in the background; the journal's segments are written under it. A store
        that holds it already (a sharded run's parent, `hold_sharded`) goes on holding it."""
        if self.lease is not None:
            yield
            return
        with self._leased():
            yield

    @contextlib.contextmanager
    def hold_sharded(self, shards: int) -> Iterator[None]:
        """The lease, marked with the number of shards, held throughout (the shards write under it, each
        holding its own shard lease: `shard_hold`; a run that is not sharded is refused)."""
        with self._leased(shards=shards):
            yield

    @contextlib.contextmanager
    def _leased(self, shards: int | None = None) -> Iterator[None]:
        lease = Lease(self, RUN, clock=self.clock, on_lost=self.watch.note, shards=shards)
        lease.acquire()
        try:
            lease.start()
            self.lease = lease
            self.segments = SegmentJournal(self, next_run(self.list(JOURNAL)), fence=lease.check)
            yield
        finally:
            self.segments = self.lease = None
            lease.release()

    def shut_out_shards(self) -> None:
        """The parent's lease marked shut: a shard starting now is refused (`ParentLease`)."""
        if self.lease is not None and self.lease.shards:
            self.lease.shut_out()

    @contextlib.contextmanager
    def shard_hold(self) -> Iterator[None]:
        """This shard's own lease, under its parent's lease on the prefix (`storage.lease.ParentLease`);
        its segments, `journal/<run>-<I-of-N>-<seq>.jsonl`, are written only while both are held."""
        shard = str(self.shard)
        name = layout.shard_lease(shard)
        lease = Lease(self, f"shard {shard}", name=name, clock=self.clock, on_lost=self.watch.note)
        lease.acquire()
        try:
            parent = ParentLease(self, shard, clock=self.clock)  # refused unless its sharded run holds it
            lease.start()

            def fence() -> None:
                lease.check()
                parent.check()

            self.lease = lease
            self.segments = SegmentJournal(self, next_run(self.list(JOURNAL)), shard=shard, fence=fence)
            yield
        finally:
            self.segments = self.lease = None
            lease.release()

    def in_use(self) -> str | None:
        """The lease object read (`storage.lease.lease_holder`)."""
        return lease_holder(self, self.clock)

    def shard_held(self, shard: str) -> bool:
        return live_lease(self, layout.shard_lease(shard), self.clock) is not None

    # -- records --

    def append(self, kind: str, record: dict[str, Any], *, sync: bool) -> None:
        """Into the next segment; with `sync`, once that segment is in. A usage line is never synced on
        its own: the next synced journal line carries it."""
        line = record if kind == layout.JOURNAL else {"event": USAGE_EVENT, **record}
        with self.watch.writing():
            if self.segments is None:
                raise OSError(errno.EIO, f"{self.url} is not held by this run: nothing can be journaled")
            self.segments.append(json_line(line), sync and kind == layout.JOURNAL)

    def sync(self) -> None:
        """The pending lines PUT as a segment; a run holding the prefix alone then compacts the journal
        into one object, so that a rerun reads one object, not every segment."""
        if (segments := self.segments) is not None:
            with self.watch.writing():
                segments.sync()
                if self.shard is None:
                    segments.compact()

    def records(self, kind: str, bad: BadLine | None = None) -> Iterator[dict[str, Any]]:
        for line in read_journal(self, bad):
            if kind == layout.JOURNAL:
                yield line
            elif line.pop("event", None) == USAGE_EVENT:
                yield line

    def has_records(self) -> bool:
        return bool(self.list(layout.JOURNAL_SEGMENTS))

    def keep_conversation(self, stem: str, key: str, record: dict[str, Any]) -> None:
        """An object named after the answer's files (`layout.conversation`)."""
        data = json.dumps({"key": key, **record}, separators=(",", ":")).encode()
        with self.watch.writing():
            self.put(layout.conversation(stem), data)

    def kept_conversation(self, stem: str, key: str) -> bytes | None:
        return self.get(layout.conversation(stem))

    # -- whole objects --

    def make_ready(self) -> None:
        """Nothing: the lease, taken next, proves that the prefix can be written."""

    def prepare(self) -> None:
        """Nothing: an object store has no folders to make."""

    def files_exist(self, names: list[str], settled: bool) -> bool:
        """A settled outcome is trusted (it was journaled after its files were written): a rerun reads no
        image and makes no request per image; only an answer whose outcome was never journaled has its
        files looked up (HEAD)."""
        return settled or all(self.exists(p) for p in names)

    def stamp(self, name: str) -> object:
        return "bucket"

    def records_stamp(self) -> list[Any]:
        """Every journal object's (name, size, ETag) (the usage lines are in the journal), then those of
        the objects of `layout.STAMPED`: a listing and a HEAD each, no object read."""
        return [*self.list_meta(layout.JOURNAL_SEGMENTS), *(self.meta(name) for name in layout.STAMPED)]

    @contextlib.contextmanager
    def replacing(self, name: str) -> Iterator[BinaryIO]:
        """Row by row into a temporary file, then one multipart upload."""
        with tempfile.TemporaryFile(prefix="imagebatch-upload-") as spool:
            yield spool
            spool.seek(0)
            self.put_stream(name, spool)

    def read_lines(self, name: str) -> Generator[bytes, None, None]:
        if (chunks := self.get_stream(name)) is not None:
            for _, raw in stream_lines(chunks, f"{self.url}/{name}"):
                yield raw

    def put_derived(self, name: str, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.put(name, data)

    # -- review decisions --

    def add_decision(self, line: bytes, stamp: str) -> str:
        """One object each, `review/<stamp>-<random>.json`, created only if absent: reviewers never
        overwrite each other, and the listing gives the order."""
        while not self.put_new(name := f"{layout.REVIEW_PREFIX}{stamp}-{secrets.token_hex(6)}.json", line):
            pass  # a name already taken (vanishingly rare): draw another random part
        return name

    def decision_lines(self, bad: BadLine | None = None) -> Iterator[tuple[int, str, bytes]]:
        """The objects read a few at a time, in the listing's order."""
        names = self.list(layout.REVIEW_PREFIX)
        with ThreadPoolExecutor(max_workers=16) as pool:
            got = list(zip(names, pool.map(self.get, names), strict=True))
        for number, (name, raw) in enumerate(got, 1):
            if raw is not None:
                yield number, f"{self.url}/{name}", raw

    def decision_tail(self) -> _ReviewObjectsTail:
        return _ReviewObjectsTail(self)

    @contextlib.contextmanager
    def local_copy(self, folder: Path | None = None) -> Iterator[BucketCopy]:
        """A staging folder for the objects a reader fetches: `folder` (which keeps them), else a
        temporary one, removed after."""
        with contextlib.ExitStack() as stack:
            where = folder if folder is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
            yield BucketCopy(self, where)


class BucketCopy:
    """The staging folder `folder` of the objects of `loc` a reader asked for."""

    def __init__(self, loc: ObjectLocation, folder: Path) -> None:
        self.loc, self.folder = loc, folder

    def fetch(self, names: Iterable[str], placeholders: Iterable[str] = ()) -> None:
        """Fetch `names` (`READ_THREADS` at a time; one not there is skipped), and leave each of
        `placeholders` an empty file dated 1970 (an image whose thumbnail is there: the report keeps the
        thumbnail). A name that would climb out of the folder (`..`) is neither.

        Each object is streamed into its file (`ObjectLocation.get_stream`: a results.csv of 500,000 rows
        is over 100 MB), and only a window of names is in flight: what a fetch holds is a few chunks,
        whatever the objects' sizes and however many the names."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="imagebatch-stage") as ex:
            window: deque[Future[None]] = deque()
            for name in self._inside(names):
                if len(window) >= 2 * READ_THREADS:
                    window.popleft().result()
                window.append(ex.submit(self._fetch_one, name))
            while window:
                window.popleft().result()
        for rel in self._inside(placeholders):
            (self.folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.folder / rel).touch()
            os.utime(self.folder / rel, (0, 0))

    def _inside(self, names: Iterable[str]) -> Iterator[str]:
        """`names` but those that would climb out of the folder."""
        inside = self.folder.resolve()
        return (n for n in names if (inside / n).resolve().is_relative_to(inside))

    def _fetch_one(self, name: str) -> None:
        """The object `name` into its file, chunk by chunk into a temporary file beside it, then renamed:
        a fetch cut short leaves no half file under the name. Nothing when there is no such object."""
        chunks = self.loc.get_stream(name)
        if chunks is None:
            return
        target = self.folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(prefix=".imagebatch-fetch-", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
            os.replace(part, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(part)
            raise

    def publish(self, names: Iterable[str]) -> None:
        """Upload the files `names` of the folder back into the bucket."""
        for name in names:
            self.loc.put(name, (self.folder / name).read_bytes())

    def remove(self, names: Iterable[str]) -> None:
        for name in names:
            self.loc.delete(name)

    def top_names(self) -> list[str]:
        return self.loc.list_top()


class _ReviewObjectsTail:
    """A reader's place in a bucket's decisions: every object read so far (small: a line each)."""

    def __init__(self, loc: ObjectLocation) -> None:
        self.loc = loc
        self._objects: dict[str, bytes | None] = {}

    def read(self) -> tuple[list[tuple[str, bytes]], bool]:
        """The objects listed that were not read before; all of them again when one of those sorts
        before an object read before (another server's clock): the record is then replayed anew."""
        names = self.loc.list(layout.REVIEW_PREFIX)
        new = [name for name in names if name not in self._objects]
        if not new:
            return [], False
        last_read = max(self._objects, default="")
        with ThreadPoolExecutor(max_workers=min(16, len(new))) as pool:
            for name, raw in zip(new, pool.map(self.loc.get, new), strict=True):
                self._objects[name] = raw
        whole = new[0] <= last_read
        return [
            (f"{self.loc.url}/{n}", raw) for n in (names if whole else new) if (raw := self._objects.get(n))
        ], whole

    def wrote(self, name: str, line: bytes) -> bool:
        """True: the new object is put in force as the last one read instead of listing them all again (a
        listing per decision took 0.7 s at 2,000 decisions); one another server made meanwhile that sorts
        before it is then listed before an object read, and the whole record replayed."""
        self._objects[name] = line
        return True
