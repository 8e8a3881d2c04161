"""The output location (a local folder, or an object store's prefix): the source of truth for what has
been done. Its bytes go through the storage seam (`storage.location.Location`); this module keeps the
protocol: what is written, in which order, and how a rerun replays it.

Layout of a local folder::

    images/          every image and text output, written atomically (temporary file, then rename)
    chains/          the edit history of each chain, as the service returned it, after each turn
    journal.jsonl    write-ahead: an attempt is recorded (and fsynced) before it is sent; outcomes follow.
                     Synced: `attempt_started`, a success's `answered` (before its files), and every line of
                     a request that did not succeed; a success's `attempt_finished` and `outcome` ride on
                     the next fsync (a power cut that loses them loses nothing `load_state` needs)
    usage.jsonl      one line per HTTP attempt, appended as it finishes
    results.csv      one row per request, rewritten atomically at the end of each run
    run.json         what the last run was asked and what it did

A rerun reads the journal, not Prefect's database, so a copied output directory resumes correctly. A line
cut short by a crash (kill -9 in the middle of a write) is ignored when the journal is read.

In an object store (`s3://bucket/prefix`, `storage.objectstore`) the same names hold whole objects, except
the journal: its lines (and usage's, as `"event": "usage"` lines) go to `journal/<run>-<seq>.jsonl`
segments, one create-only PUT per group commit, compacted into one object at the end of a run; the lock is
the lease object `.imagebatch.lease` (a sharded run's parent holds it throughout, each shard its own
`.imagebatch.shard-I-of-N.lease` too); `thumbs/` and `report*.html` are uploaded whole.

One module on purpose: the journal's write order, its replay (`load_state`), the
locks and the shards' merge are one protocol; split, each half would have to restate the other's rules.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

from imagebatch.gateway import AttemptEvent, AttemptStarted
from imagebatch.manifest.plan import key_digits
from imagebatch.storage import layout
from imagebatch.storage.csvcells import read_csv, write_csv
from imagebatch.storage.location import (
    LocalFolder,
    Location,
    OutputLockedError,
    atomic_file,
    confined,
    json_object,
    open_location,
    write_atomic,
)
from imagebatch.work.thumbnails import make_thumbnail, put_thumbnail

if TYPE_CHECKING:
    from imagebatch.manifest import PlannedRequest
    from imagebatch.storage.objectstore import Lease, ObjectLocation, SegmentJournal

__all__ = ["OutputLockedError", "atomic_file", "write_atomic"]

Status = Literal["succeeded", "no_image", "failed", "unknown", "not_attempted", "skipped"]
STATUSES: tuple[Status, ...] = ("succeeded", "no_image", "failed", "unknown", "not_attempted", "skipped")

RESULT_COLUMNS = (
    "job_id",
    "request_index",
    "turn_index",
    "variant",
    "status",
    "paths",
    "images",
    "width",
    "height",
    "mime_type",
    "model",
    "route",
    "idempotency_key",
    "attempts",
    "finish_reason",
    "error",
    "request_id",
)


def file_stem(req: PlannedRequest, chain: bool) -> str:
    """`<job>/<request>[-t<turn>][-v<variant>]-<key>`: one folder per job (ids are unique, so names cannot
    collide), and the key in the name, so an edited row's image never overwrites the one its old key
    points to; `-v<n>` for variant n >= 2 (a redo), whose key differs too."""
    turn = f"-t{req.turn_index}" if chain else ""
    variant = f"-v{req.variant}" if req.variant > 1 else ""
    return f"{req.job_id}/{req.request_index}{turn}{variant}-{key_digits(req.idempotency_key)[:12]}"


@dataclass(slots=True)
class RequestRecord:
    """The outcome of one request: a results.csv row without the manifest's metadata. Small by design."""

    job_id: str
    request_index: int
    turn_index: int
    status: Status
    model: str
    route: str
    idempotency_key: str
    paths: list[str] = field(default_factory=list)
    images: int = 0
    width: int | None = None
    height: int | None = None
    mime_type: str | None = None
    attempts: int = 0
    finish_reason: str | None = None
    error: str | None = None
    request_id: str | None = None
    http_status: int | None = None
    """The HTTP status of the answer that made the request `failed` or `unknown` (None: no such answer)."""
    variant: int = 1
    """1 for a request's first sample, n for the n-th (`--redo rejected`); a record without one is 1. Last,
    so that records built by position keep their meaning (results.csv's column order is `RESULT_COLUMNS`)."""

    def to_row(self) -> dict[str, Any]:
        row = {k: getattr(self, k) for k in RESULT_COLUMNS}
        row["paths"] = ";".join(self.paths)
        return {k: ("" if v is None else v) for k, v in row.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects of a JSON Lines file, skipping a final line cut short by a crash."""
    if not path.exists():
        return
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                return  # torn last write
            if (obj := json_object(raw)) is not None:
                yield obj


@dataclass
class KeyState:
    """What the journal says about one idempotency key: its last outcome, or what happened since."""

    outcome: RequestRecord | None = None
    """The last recorded outcome (None after a new attempt started)."""
    pending: bool = False
    """An attempt was started and never finished: it may have been generated and billed."""
    unanswered: bool = False
    """Since the last outcome, some attempt got no answer (it may have been generated and billed)."""
    answered_ok: bool = False
    """Since the last outcome, a success answer arrived."""
    answered: RequestRecord | None = None
    """The record planned for that answer, journaled before its files were written."""
    attempts: int = 0
    variant: int = 1
    """The variant the key is of, from its journal lines (1 when they name none)."""
    request: tuple[str, int, int] | None = None
    """(job_id, request_index, turn_index) of a variant >= 2, from its journal lines; None for variant 1
    (`work.variants` finds a request's variants by it)."""

    @property
    def status(self) -> Status | None:
        """The status a rerun starts from (None: never sent, or its files are gone)."""
        if self.outcome is not None:
            return self.outcome.status
        if self.pending or self.unanswered or self.answered_ok:
            return "unknown"
        return "failed" if self.attempts else None


_NO_FOLDER = Path("/dev/null/imagebatch-object-store")
"""The base of an object store's local paths: never used; a stray local write there fails at once."""


class OutputStore:
    """Reads and writes one output location (a local folder, or an object store's prefix: see the module
    docstring). Safe to share between the threads of one run.

    `clock`: the wall clock an object store's lease is timed by (tests inject one)."""

    def __init__(
        self, root: Path | str, shard: str | None = None, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.location: Location = open_location(root)
        self.where = self.location.url
        """The location as messages name it: a folder's path, or `s3://bucket/prefix` (no credential)."""
        self._folder = self.location.root if isinstance(self.location, LocalFolder) else None
        self.clock = clock
        self.shard = shard
        """`I-of-N` for one shard of a sharded run (its own journal and usage file), else None."""
        base = self._folder or _NO_FOLDER
        self.images_dir = base / layout.IMAGES_DIR
        self.chains_dir = base / layout.CHAINS_DIR
        self.journal_path = base / layout.jsonl(layout.JOURNAL, shard)
        self.usage_path = base / layout.jsonl(layout.USAGE_LEDGER, shard)
        self.conversations_path = base / layout.jsonl(layout.CONVERSATIONS, shard)
        self._conversations: dict[str, tuple[Path, int, int]] = {}
        """Where each key's kept conversation is (`load_conversation`), as far as read."""
        self._conversations_read: dict[Path, int] = {}
        self.results_path = base / layout.RESULTS_CSV
        self.run_path = base / layout.RUN_JSON
        self._segments: SegmentJournal | None = None
        """An object store's journal while this run holds the prefix."""
        self._lease: Lease | None = None
        self._lock = threading.Lock()
        self._tail_checked: set[Path] = set()
        self._written: dict[Path, int] = {}
        """Lines appended to each file by this store."""
        self._synced: dict[Path, int] = {}
        """Of those, how many an fsync that started after them has covered."""
        self._sync_locks: dict[Path, threading.Lock] = {}
        self.write_error: OSError | None = None
        """The first write that failed (a full disk, ...): the run stops dispatching at it."""
        self.on_write_error: Callable[[OSError], None] | None = None

    @property
    def root(self) -> Path:
        """The local folder (an object store has none: what needs one asks the store instead)."""
        if self._folder is None:
            raise TypeError(f"{self.where} is an object store, not a local folder")
        return self._folder

    @property
    def is_object_store(self) -> bool:
        return self._folder is None

    @property
    def spool_folder(self) -> Path:
        """Where the run keeps its records until results.csv is written: the folder, or the machine's
        temporary folder for an object store."""
        return self._folder or Path(tempfile.gettempdir())

    def _object_location(self) -> ObjectLocation:
        from imagebatch.storage.objectstore import ObjectLocation

        assert isinstance(self.location, ObjectLocation)
        return self.location

    @contextlib.contextmanager
    def _writing(self, path: Path | None = None) -> Iterator[None]:
        """Note the first failed write and tell `on_write_error`; the error goes on to the caller."""
        try:
            yield
        except OSError as exc:
            if path is not None:
                self._tail_checked.discard(path)  # a partial line may be left: end it before the next one
            self._note_write_error(exc)
            raise

    def _note_write_error(self, exc: OSError) -> None:
        if self.write_error is None:
            self.write_error = exc
            if self.on_write_error is not None:
                self.on_write_error(exc)

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

        In an object store, the lease (`storage.objectstore.Lease`) is held instead, renewed in the
        background; the journal's segments are written under it. A store that holds it already (a sharded
        run's parent, `hold_sharded`) goes on holding it."""
        if self._folder is None:
            if self._lease is not None:
                yield
                return
            with self._leased("another imagebatch run"):
                yield
            return
        with self._flock(layout.LOCK, fcntl.LOCK_EX, "another imagebatch run"):
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
        if self._folder is not None:
            yield
            return
        with self._leased("another imagebatch run", shards=shards):
            yield

    @contextlib.contextmanager
    def _leased(self, what: str, shards: int | None = None) -> Iterator[None]:
        from imagebatch.storage.objectstore import JOURNAL, Lease, SegmentJournal, next_run

        loc = self._object_location()
        lease = Lease(loc, what, clock=self.clock, on_lost=self._note_write_error, shards=shards)
        lease.acquire()
        try:
            lease.start()
            self._lease = lease
            self._segments = SegmentJournal(loc, next_run(loc.list(JOURNAL)), fence=lease.check)
            yield
        finally:
            self._segments = self._lease = None
            lease.release()

    @contextlib.contextmanager
    def shard_hold(self) -> Iterator[None]:
        """Hold the folder as one shard: shared with the other shards of the run, alone for this shard.

        In an object store: this shard's own lease, under its parent's lease on the prefix
        (`storage.objectstore.ParentLease`); its segments, `journal/<run>-<I-of-N>-<seq>.jsonl`, are written
        only while both are held."""
        if self._folder is None:
            with self._shard_leased():
                yield
            return
        with (
            self._flock(layout.LOCK, fcntl.LOCK_SH, "a run that is not sharded"),
            self._flock(layout.shard_lock(str(self.shard)), fcntl.LOCK_EX, f"shard {self.shard}"),
        ):
            yield

    def in_use(self) -> str | None:
        """Who is sending into the location now (a run, or a shard of one), or None: tested without
        holding anything. A folder's locks are each tried shared and non-blocking, and let go at once (a
        run holds its lock alone, a shard its own); a lock file never made means no run ever held it, and
        none is made. An object store's lease object is read (`objectstore.lease_holder`)."""
        if self._folder is None:
            from imagebatch.storage.objectstore import lease_holder

            return lease_holder(self._object_location(), self.clock)
        names = [layout.LOCK, *(p.name for p in self.root.glob(layout.shard_lock("*")))]
        for name in names:
            try:
                fd = os.open(self.root / name, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return "a shard of a sharded run" if name != layout.LOCK else "another imagebatch run"
            finally:
                os.close(fd)  # lets go of the shared lock, if it was taken
        return None

    @contextlib.contextmanager
    def _shard_leased(self) -> Iterator[None]:
        from imagebatch.storage.objectstore import (
            JOURNAL,
            Lease,
            ParentLease,
            SegmentJournal,
            next_run,
            shard_lease_name,
        )

        loc, shard = self._object_location(), str(self.shard)
        name = shard_lease_name(shard)
        lease = Lease(loc, f"shard {shard}", name=name, clock=self.clock, on_lost=self._note_write_error)
        lease.acquire()
        try:
            parent = ParentLease(loc, shard, clock=self.clock)  # refused unless its sharded run holds it
            lease.start()

            def fence() -> None:
                lease.check()
                parent.check()

            self._lease = lease
            self._segments = SegmentJournal(loc, next_run(loc.list(JOURNAL)), shard=shard, fence=fence)
            yield
        finally:
            self._segments = self._lease = None
            lease.release()

    def shard_held(self, shard: str) -> bool:
        """Whether a process holds shard `shard`'s lock now (a shard's process holds it while it sends);
        in an object store, whether its shard lease is live."""
        if self._folder is None:
            from imagebatch.storage.objectstore import live_lease, shard_lease_name

            return live_lease(self._object_location(), shard_lease_name(shard), self.clock) is not None
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
        if self._folder is None:
            return merged
        for kind in (layout.JOURNAL, layout.USAGE_LEDGER):
            for part in sorted(self.root.glob(layout.shard_jsonl(kind))):
                lines = [line for line in part.read_bytes().splitlines(keepends=True) if line.endswith(b"\n")]
                if lines:
                    target = self.root / layout.jsonl(kind)
                    with target.open("ab") as fh:
                        if fh.tell() and _last_byte(target) != b"\n":
                            fh.write(b"\n")
                        fh.write(b"".join(lines))
                        fh.flush()
                        os.fsync(fh.fileno())
                merged += len(lines)
                part.unlink()
        return merged

    def prepare(self) -> None:
        if self._folder is None:
            return  # an object store has no folders to make
        self.images_dir.mkdir(parents=True, exist_ok=True)
        self.chains_dir.mkdir(parents=True, exist_ok=True)

    # -- journal and usage --

    def _append(self, path: Path, record: dict[str, Any], *, sync: bool) -> None:
        """Append one line; with `sync`, return only once it is on disk.

        Lines are written one at a time (under the lock), but synced together: a thread whose line an
        fsync already covers returns without its own (group commit). The fsync runs outside the lock,
        so a run's request threads do not queue behind each other's disk waits (one fsync per line
        under one lock was most of a 64-thread run's waiting)."""
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        with self._writing(path), confined(self.root, path.name).open("ab") as fh:  # no link out of OUT
            with self._lock:
                if path not in self._tail_checked:
                    # A line torn by a crash has no newline: end it, or this record would be glued onto
                    # it and lost with it when the file is read.
                    self._tail_checked.add(path)
                    if fh.tell() and _last_byte(path) != b"\n":
                        line = b"\n" + line
                fh.write(line)
                fh.flush()
                written = self._written[path] = self._written.get(path, 0) + 1
            if sync:
                self._sync_through(path, fh, written)

    def _sync_through(self, path: Path, fh: BinaryIO, written: int) -> None:
        """Make `path`'s first `written` lines durable, unless an fsync already did (group commit)."""
        with self._lock:
            syncing = self._sync_locks.setdefault(path, threading.Lock())
        with syncing:
            if self._synced.get(path, 0) < written:
                upto = self._written[path]  # every line counted here was written before the fsync
                os.fsync(fh.fileno())  # of the file: the lines other threads wrote are synced too
                self._synced[path] = upto

    def journal(self, event: str, *, sync: bool = True, **fields: Any) -> None:
        """Append an event to the write-ahead journal and make it durable before returning.

        `sync=False` for a line a synced one will cover before it matters: the next fsync of the journal
        (any thread's) covers every line written before it, and `sync` at the end of a run covers the
        rest. A success's `attempt_finished` is followed by its synced `answered`, and its `outcome` only
        repeats what `answered` and the files on disk already say; each fsync saved is 1-4 ms of a request
        thread's time between answer and next send (bench/README.md "Throughput")."""
        if self._folder is None:
            self._append_segment({"event": event, **fields}, sync=sync)
            return
        self._append(self.journal_path, {"event": event, **fields}, sync=sync)

    def _append_segment(self, record: dict[str, Any], *, sync: bool) -> None:
        """An object store's journal line: into the next segment; with `sync`, once that segment is in."""
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        with self._writing():
            if self._segments is None:
                raise OSError(errno.EIO, f"{self.where} is not held by this run: nothing can be journaled")
            self._segments.append(line, sync)

    def sync(self) -> None:
        """Make every line appended so far durable (the journal's and usage's unsynced lines).

        In an object store, a run holding the prefix alone then compacts the journal into one object (the
        end of a run is the one caller), so that a rerun reads one object, not every segment."""
        if self._folder is None:
            if self._segments is not None:
                with self._writing():
                    self._segments.sync()
                    if self.shard is None:
                        self._segments.compact()
            return
        for path in (self.journal_path, self.usage_path):
            with self._lock:
                written = self._written.get(path, 0)
            if self._synced.get(path, 0) < written:
                with path.open("ab") as fh:
                    self._sync_through(path, fh, written)

    def append_usage(self, record: dict[str, Any]) -> None:
        if self._folder is None:
            self._append_segment({"event": "usage", **record}, sync=False)
            return
        self._append(self.usage_path, record, sync=False)

    def usage_lines(self) -> Iterator[dict[str, Any]]:
        """The usage ledger: one line per HTTP attempt, every run into the location."""
        if self._folder is not None:
            yield from read_jsonl(self.usage_path)
            return
        for ev in self._journal_events():
            if ev.pop("event", None) == "usage":
                yield ev

    def _journal_events(self) -> Iterator[dict[str, Any]]:
        """The journal's lines in order (the folder's journal, then the shards' not yet merged)."""
        if self._folder is None:
            from imagebatch.storage.objectstore import read_journal

            yield from read_journal(self._object_location())
            return
        journals = [
            self.root / layout.jsonl(layout.JOURNAL),
            *sorted(self.root.glob(layout.shard_jsonl(layout.JOURNAL))),
        ]
        for path in journals:
            yield from read_jsonl(path)

    def record_outcome(self, record: RequestRecord) -> None:
        """Journal a request's outcome; a success's needs no fsync of its own (its synced `answered` and
        its files already make it done on replay, see `load_state`)."""
        self.journal("outcome", sync=record.status != "succeeded", **asdict(record))

    def load_state(self, seen: Callable[[dict[str, Any]], None] | None = None) -> dict[str, KeyState]:
        """Replay the journal into the state of every idempotency key it names.

        A success whose files are all on disk counts as succeeded even if the process died before its
        outcome was journaled (the `answered` event names the files first); a succeeded outcome whose
        files are gone counts as never done, so a rerun makes them again. `seen` is given every event
        that names a key, in order, as it is replayed (`validate --out` notes each request's last key).
        """
        states: dict[str, KeyState] = {}
        for ev in self._journal_events():
            key = ev.get("idempotency_key")
            if not isinstance(key, str) or ev.get("event") == "usage":
                continue
            if seen is not None:
                seen(ev)
            st = states.setdefault(key, KeyState())
            if st.request is None and isinstance(variant := ev.get("variant"), int) and variant > 1:
                st.variant = variant
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    st.request = (str(ev["job_id"]), int(ev["request_index"]), int(ev["turn_index"]))
            kind = ev.get("event")
            if kind == "attempt_started":
                if st.outcome is not None:  # a new send supersedes the last outcome
                    st.outcome, st.unanswered, st.answered_ok, st.answered = None, False, False, None
                st.pending = True
                st.attempts += 1
            elif kind == "attempt_finished":
                st.pending = False
                st.unanswered |= ev.get("outcome") == "no_answer"
                st.answered_ok |= ev.get("outcome") == "ok"
            elif kind in ("answered", "outcome"):
                try:
                    record = RequestRecord.from_json(ev)
                except (TypeError, ValueError):
                    continue  # a damaged record: the key stays in doubt rather than wrongly settled
                if kind == "answered":
                    st.answered = record
                else:
                    st.outcome, st.pending, st.unanswered, st.answered_ok, st.answered = (
                        record, False, False, False, None,
                    )  # fmt: skip
        for st in states.values():
            if (
                st.outcome is None
                and st.answered is not None
                and not st.pending
                and self._files_exist(st.answered, settled=False)
            ):
                st.outcome = st.answered
            elif (
                st.outcome is not None
                and st.outcome.status == "succeeded"
                and not self._files_exist(st.outcome, settled=True)
            ):
                st.outcome = None
                st.attempts = 0  # its files were removed: make it again
        return states

    def _files_exist(self, record: RequestRecord, *, settled: bool) -> bool:
        """Whether a record's files are all there. In an object store a settled outcome is trusted (it was
        journaled after its files were written): a rerun reads no image and makes no request per image;
        only an answer whose outcome was never journaled has its files looked up (HEAD)."""
        if self._folder is None:
            return settled or all(self.location.exists(p) for p in record.paths)
        return all((self.root / p).is_file() for p in record.paths)

    # -- files --

    def write_file(self, name: str, data: bytes) -> str:
        """Write an output file under images/ atomically; return its path relative to the output folder.
        Through the location for both kinds: a folder's refuses a path that a link leads out of OUT."""
        with self._writing():
            self.location.put(f"{layout.IMAGES_DIR}/{name}", data)
        return f"{layout.IMAGES_DIR}/{name}"

    def thumbnail(self, rel: str, data: bytes) -> None:
        """The report's thumbnail of the image `rel`, from its bytes still in memory (best effort)."""
        if self._folder is None:
            put_thumbnail(self._object_location(), rel, data)
            return
        make_thumbnail(self.root, rel, data)

    def chain_name(self, job_id: str, request_index: int) -> str:
        """A chain's history, named relative to the output location."""
        return f"{layout.CHAINS_DIR}/{job_id}/{request_index}.json"

    def chain_path(self, job_id: str, request_index: int) -> Path:
        return self.chains_dir / job_id / f"{request_index}.json"

    def save_chain(self, job_id: str, request_index: int, history: dict[str, Any]) -> None:
        if self._folder is None:
            with self._writing():
                self.location.put(self.chain_name(job_id, request_index), json.dumps(history).encode())
            return
        with self._writing():
            write_atomic(self.chain_path(job_id, request_index), json.dumps(history).encode())

    def load_chain(self, job_id: str, request_index: int) -> dict[str, Any] | None:
        if self._folder is None:
            data = self.location.get(self.chain_name(job_id, request_index))
            return None if data is None else json.loads(data)
        path = self.chain_path(job_id, request_index)
        if not path.exists():
            return None
        return json.loads(path.read_bytes())

    def save_conversation(self, req: PlannedRequest, conversation: dict[str, Any]) -> None:
        """Keep the conversation behind one native answer (`work.conversation`): in a folder a line of
        `conversations.jsonl`, appended and not synced; in an object store an object named after the
        answer's files (`layout.conversation`).

        Appended, not a file each: a file costs a request thread about 0.4 ms of CPU (a temporary file and
        a rename; bench/README.md), a tenth of a request's whole cost in a run; an append, microseconds.
        Not synced: one more fsync per request would cost a request thread 1-4 ms, and a line a power cut
        loses only makes that image's later `--edit` a new sample (counted as "no kept history"), never a
        wrong request."""
        record = {"key": req.idempotency_key, **conversation}
        with self._writing():
            if self._folder is None:
                name = layout.conversation(file_stem(req, bool(req.job.turns)))
                self.location.put(name, json.dumps(record, separators=(",", ":")).encode())
                return
        self._append(self.conversations_path, record, sync=False)

    def load_conversation(self, req: PlannedRequest) -> dict[str, Any] | None:
        """The conversation kept for `req`'s answer by an earlier run, or None (never kept, or unreadable).

        In a folder, the conversation files are read once into an index of where each key's line is (its
        offset: the lines stay on disk), and past their last indexed line only for a key not found."""
        if self._folder is None:
            data = self.location.get(layout.conversation(file_stem(req, bool(req.job.turns))))
        else:
            with self._lock:
                where = self._conversations.get(req.idempotency_key)
                if where is None:  # not read yet: read what was appended since
                    _index_conversations(self.root, self._conversations, self._conversations_read)
                    where = self._conversations.get(req.idempotency_key)
            data = _read_at(*where) if where is not None else None
        loaded = None if data is None else json_object(data)
        return loaded if loaded is not None and loaded.get("key") == req.idempotency_key else None

    def write_results(self, rows: Iterable[dict[str, Any]], metadata_columns: list[str]) -> None:
        """Write results.csv atomically, row by row (no copy of the whole table in memory); cells that a
        spreadsheet would run as a formula are neutralised (`csv_cell`; `read_csv` reads them back)."""
        columns = list(RESULT_COLUMNS) + [c for c in metadata_columns if c not in RESULT_COLUMNS]
        if self._folder is None:
            buf = io.StringIO()
            write_csv(buf, columns, rows)
            self.location.put(layout.RESULTS_CSV, buf.getvalue().encode())
            return
        with atomic_file(self.results_path) as fh:
            text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
            write_csv(text, columns, rows)
            text.flush()
            text.detach()  # `atomic_file` syncs and closes the file itself

    def read_results(self) -> list[dict[str, str]] | None:
        """results.csv's rows, every cell as it was before the writer neutralised formulas (`csvcells`);
        None when the location has none (no run has ended there)."""
        data = self.location.get(layout.RESULTS_CSV)
        if data is None:
            return None
        return list(read_csv(io.StringIO(data.decode("utf-8"), newline="")))

    def write_run(self, info: dict[str, Any]) -> None:
        self.write_top(layout.RUN_JSON, (json.dumps(info, indent=2, default=str) + "\n").encode())

    def write_top(self, name: str, data: bytes) -> None:
        """Write a whole file at the top of the location (run.json, usage-summary.csv): whole, and in a
        folder never through a link out of it (`LocalFolder.put`)."""
        self.location.put(name, data)


_KEY_PREFIX = b'{"key":"'


def _index_conversations(root: Path, index: dict[str, tuple[Path, int, int]], read: dict[Path, int]) -> None:
    """Add to `index` the (file, offset, length) of each key's last conversation line in a folder (the
    folder's file, then the shards'), reading each file from where `read` says the last call stopped; a
    line not yet ended (being written, or cut short by a crash) is left for later."""
    paths = [
        root / layout.jsonl(layout.CONVERSATIONS),
        *sorted(root.glob(layout.shard_jsonl(layout.CONVERSATIONS))),
    ]
    for path in paths:
        if not path.is_file():
            continue
        with path.open("rb") as fh:
            offset = read.get(path, 0)
            fh.seek(offset)
            for line in fh:
                if not line.endswith(b"\n"):
                    break
                end = line.find(b'"', len(_KEY_PREFIX))
                if line.startswith(_KEY_PREFIX) and end > 0:
                    index[line[len(_KEY_PREFIX) : end].decode("ascii", "replace")] = (path, offset, len(line))
                offset += len(line)
            read[path] = offset


def _read_at(path: Path, offset: int, length: int) -> bytes | None:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read(length)
    except OSError:
        return None


class NotJournaledError(OSError):
    """An attempt could not be journaled before it was sent, so it was not sent."""

    def __init__(self, attempt: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.attempt = attempt


class AttemptJournal:
    """The client's attempt observer for one request: journal (synced) before each attempt is sent, then
    what came back, and one usage line per attempt. Attempts are numbered across runs into the folder
    (`earlier`: how many the journal already holds for this key), as results.csv counts them."""

    def __init__(
        self, store: OutputStore, req: PlannedRequest, started_keys: set[str], earlier: int = 0
    ) -> None:
        self.store = store
        self.started_keys = started_keys
        self.earlier = earlier
        self.ids = {
            "idempotency_key": req.idempotency_key,
            "job_id": req.job_id,
            "request_index": req.request_index,
            "turn_index": req.turn_index,
            "variant": req.variant,
        }

    def __call__(self, event: AttemptEvent) -> None:
        common: dict[str, Any] = {
            **self.ids,
            "route": str(event.route),
            "model": event.model,
            "attempt": self.earlier + event.attempt,
            "started_at": event.started_at.isoformat(),
        }
        if isinstance(event, AttemptStarted):
            try:
                self.store.journal("attempt_started", **common)
            except OSError as exc:  # not journaled: must not be sent (raised out of the client's loop)
                raise NotJournaledError(event.attempt, exc) from exc
            self.started_keys.add(event.idempotency_key)
            return
        error_code = event.error_code or (None if event.outcome == "ok" else event.outcome)
        finished = {
            "duration_s": round(event.duration, 4),
            "outcome": event.outcome,
            "error_code": error_code,
            "request_id": event.request_id,
            "images": event.images,
            "retry_in": event.retry_in,
        }
        try:
            # An answer (`ok`) is journaled next, synced, by `send_and_record`: that fsync covers this line.
            ok = event.outcome == "ok"
            self.store.journal("attempt_finished", sync=not ok, **common, status=event.status, **finished)
            self.store.append_usage({**common, **finished, "http_status": event.status, "usage": event.usage})
        except OSError:
            pass  # noted by the store (dispatch stops); the answer itself must still reach the caller
