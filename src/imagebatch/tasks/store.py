"""The output directory: the source of truth for what has been done.

Layout::

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

One module on purpose: the journal's write order, its replay (`load_state`), the
locks and the shards' merge are one protocol; split, each half would have to restate the other's rules.
"""

from __future__ import annotations

import contextlib
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

from . import layout
from .csvcells import write_csv

if TYPE_CHECKING:
    from imagebatch.manifest import PlannedRequest

Status = Literal["succeeded", "no_image", "failed", "unknown", "not_attempted", "skipped"]
STATUSES: tuple[Status, ...] = ("succeeded", "no_image", "failed", "unknown", "not_attempted", "skipped")

RESULT_COLUMNS = (
    "job_id",
    "request_index",
    "turn_index",
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
    """`<job>/<request>[-t<turn>]-<key>`: one folder per job (ids are unique, so names cannot collide),
    and the key in the name, so an edited row's image never overwrites the one its old key points to."""
    turn = f"-t{req.turn_index}" if chain else ""
    return f"{req.job_id}/{req.request_index}{turn}-{key_digits(req.idempotency_key)[:12]}"


class OutputLockedError(RuntimeError):
    """The output folder is held by another run."""


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

    def to_row(self) -> dict[str, Any]:
        row = {k: getattr(self, k) for k in RESULT_COLUMNS}
        row["paths"] = ";".join(self.paths)
        return {k: ("" if v is None else v) for k, v in row.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees either the old file or the whole new one."""
    with atomic_file(path) as fh:
        fh.write(data)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file to write that replaces `path` whole when the block ends (synced), or never if it raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; outputs are ordinary files others may read
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
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

    @property
    def status(self) -> Status | None:
        """The status a rerun starts from (None: never sent, or its files are gone)."""
        if self.outcome is not None:
            return self.outcome.status
        if self.pending or self.unanswered or self.answered_ok:
            return "unknown"
        return "failed" if self.attempts else None


class OutputStore:
    """Reads and writes one output directory. Safe to share between the threads of one run."""

    def __init__(self, root: Path, shard: str | None = None) -> None:
        self.root = Path(root)
        self.shard = shard
        """`I-of-N` for one shard of a sharded run (its own journal and usage file), else None."""
        self.images_dir = self.root / layout.IMAGES_DIR
        self.chains_dir = self.root / layout.CHAINS_DIR
        self.journal_path = self.root / layout.jsonl(layout.JOURNAL, shard)
        self.usage_path = self.root / layout.jsonl(layout.USAGE_LEDGER, shard)
        self.results_path = self.root / layout.RESULTS_CSV
        self.run_path = self.root / layout.RUN_JSON
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

    @contextlib.contextmanager
    def _writing(self, path: Path | None = None) -> Iterator[None]:
        """Note the first failed write and tell `on_write_error`; the error goes on to the caller."""
        try:
            yield
        except OSError as exc:
            if path is not None:
                self._tail_checked.discard(path)  # a partial line may be left: end it before the next one
            if self.write_error is None:
                self.write_error = exc
                if self.on_write_error is not None:
                    self.on_write_error(exc)
            raise

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
        before it merged them) are merged first: every later line goes after theirs."""
        with self._flock(layout.LOCK, fcntl.LOCK_EX, "another imagebatch run"):
            self.merge_shards()
            yield

    @contextlib.contextmanager
    def shard_hold(self) -> Iterator[None]:
        """Hold the folder as one shard: shared with the other shards of the run, alone for this shard."""
        with (
            self._flock(layout.LOCK, fcntl.LOCK_SH, "a run that is not sharded"),
            self._flock(layout.shard_lock(str(self.shard)), fcntl.LOCK_EX, f"shard {self.shard}"),
        ):
            yield

    def shard_held(self, shard: str) -> bool:
        """Whether a process holds shard `shard`'s lock now (a shard's process holds it while it sends)."""
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
        with self._writing(path), path.open("ab") as fh:
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
        self._append(self.journal_path, {"event": event, **fields}, sync=sync)

    def sync(self) -> None:
        """Make every line appended so far durable (the journal's and usage's unsynced lines)."""
        for path in (self.journal_path, self.usage_path):
            with self._lock:
                written = self._written.get(path, 0)
            if self._synced.get(path, 0) < written:
                with path.open("ab") as fh:
                    self._sync_through(path, fh, written)

    def append_usage(self, record: dict[str, Any]) -> None:
        self._append(self.usage_path, record, sync=False)

    def record_outcome(self, record: RequestRecord) -> None:
        """Journal a request's outcome; a success's needs no fsync of its own (its synced `answered` and
        its files already make it done on replay, see `load_state`)."""
        self.journal("outcome", sync=record.status != "succeeded", **asdict(record))

    def load_state(self) -> dict[str, KeyState]:
        """Replay the journal into the state of every idempotency key it names.

        A success whose files are all on disk counts as succeeded even if the process died before its
        outcome was journaled (the `answered` event names the files first); a succeeded outcome whose
        files are gone counts as never done, so a rerun makes them again.
        """
        states: dict[str, KeyState] = {}
        journals = [
            self.root / layout.jsonl(layout.JOURNAL),
            *sorted(self.root.glob(layout.shard_jsonl(layout.JOURNAL))),
        ]
        for ev in (ev for path in journals for ev in read_jsonl(path)):
            key = ev.get("idempotency_key")
            if not isinstance(key, str):
                continue
            st = states.setdefault(key, KeyState())
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
                and self._files_exist(st.answered)
            ):
                st.outcome = st.answered
            elif (
                st.outcome is not None
                and st.outcome.status == "succeeded"
                and not self._files_exist(st.outcome)
            ):
                st.outcome = None
                st.attempts = 0  # its files were removed: make it again
        return states

    def _files_exist(self, record: RequestRecord) -> bool:
        return all((self.root / p).is_file() for p in record.paths)

    # -- files --

    def write_file(self, name: str, data: bytes) -> str:
        """Write an output file under images/ atomically; return its path relative to the output folder."""
        path = self.images_dir / name
        with self._writing():
            write_atomic(path, data)
        return path.relative_to(self.root).as_posix()

    def chain_path(self, job_id: str, request_index: int) -> Path:
        return self.chains_dir / job_id / f"{request_index}.json"

    def save_chain(self, job_id: str, request_index: int, history: dict[str, Any]) -> None:
        with self._writing():
            write_atomic(self.chain_path(job_id, request_index), json.dumps(history).encode())

    def load_chain(self, job_id: str, request_index: int) -> dict[str, Any] | None:
        path = self.chain_path(job_id, request_index)
        if not path.exists():
            return None
        return json.loads(path.read_bytes())

    def write_results(self, rows: Iterable[dict[str, Any]], metadata_columns: list[str]) -> None:
        """Write results.csv atomically, row by row (no copy of the whole table in memory); cells that a
        spreadsheet would run as a formula are neutralised (`csv_cell`; `read_csv` reads them back)."""
        columns = list(RESULT_COLUMNS) + [c for c in metadata_columns if c not in RESULT_COLUMNS]
        with atomic_file(self.results_path) as fh:
            text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
            write_csv(text, columns, rows)
            text.flush()
            text.detach()  # `atomic_file` syncs and closes the file itself

    def write_run(self, info: dict[str, Any]) -> None:
        write_atomic(self.run_path, (json.dumps(info, indent=2, default=str) + "\n").encode())


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
