"""What one run's batches (its Prefect task runs) and request threads share: the client, the output folder,
what earlier runs left, the halt flag, and each unit's records."""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from imagebatch.gateway import GatewayClient
from imagebatch.gateway.constants import ENV_API_KEY
from imagebatch.manifest import Job, PlannedRequest
from imagebatch.work.records import storage_message
from imagebatch.work.store import KeyState, OutputStore, RequestRecord

Decision = Literal["send", "skip", "carry"]


@dataclass(slots=True)
class Unit:
    """The requests one task sends: one, or the turns of one chain in order."""

    index: int
    """Position in the run's list of units (results are kept in this order)."""
    job: Job
    requests: list[PlannedRequest]

    @property
    def name(self) -> str:
        first = self.requests[0]
        variant = f" v{first.variant}" if first.variant > 1 else ""
        turn = f" t{first.turn_index}" if variant and first.turn_index else ""
        return f"{self.job.id}#{first.request_index}{turn}{variant}"

    @property
    def is_chain(self) -> bool:
        """The turns of a chain, sent in order (a variant of one turn is a unit of its own, not a chain)."""
        return bool(self.job.turns) and self.requests[0].variant == 1


def group_units(requests: Iterable[PlannedRequest]) -> Iterator[Unit]:
    """One unit per (job, request index, variant), as the requests come: a plain request, or a chain's
    turns in order. A unit's requests are consecutive in a plan (`manifest.plan`), so only the unit being
    filled is held."""
    unit: Unit | None = None
    index = 0
    for req in requests:
        if unit is not None and (req.job_id, req.request_index, req.variant) != _unit_key(unit.requests[0]):
            yield unit
            unit, index = None, index + 1
        if unit is None:
            unit = Unit(index, req.job, [])
        unit.requests.append(req)
    if unit is not None:
        yield unit


def _unit_key(req: PlannedRequest) -> tuple[str, int, int]:
    return req.job_id, req.request_index, req.variant


class RecordSpool(Mapping[int, list[RequestRecord]]):
    """Each finished unit's records, by unit index, kept in a nameless temporary file in the output folder
    instead of in memory: a run keeps a record of every request until it writes results.csv at its end,
    about 0.8 KB each in memory (10,000 requests: 8 MB; 100,000: 80 MB), 0.1 KB here (an offset and a
    length). Reading one back costs tens of microseconds.

    Where the file cannot be made or written (a full disk: an error, or a write cut short), records are
    kept in memory instead: they are never lost, and the journal has them anyway. A unit's records are
    in the file only once all their bytes are. Thread-safe; `close` drops the file. `pwrite` is
    `os.pwrite` (tests pass one that fails or writes short)."""

    def __init__(
        self, folder: Path | None = None, pwrite: Callable[[int, bytes, int], int] = os.pwrite
    ) -> None:
        self._pwrite = pwrite
        self._lock = threading.Lock()
        self._where: dict[int, tuple[int, int]] = {}
        self._memory: dict[int, list[RequestRecord]] = {}
        self._end = 0
        self._fd: int | None = None
        if folder is not None:
            with contextlib.suppress(OSError):
                self._fd = _nameless_file(folder)
        self._closer = weakref.finalize(self, _close, self._fd)  # a spool nobody closed, once collected

    def __setitem__(self, index: int, records: list[RequestRecord]) -> None:
        data = pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._memory.pop(index, None)
            self._where.pop(index, None)
            if self._fd is not None and self._write_whole(self._fd, data):
                self._where[index] = (self._end, len(data))
                self._end += len(data)
                return
            self._memory[index] = records

    def _write_whole(self, fd: int, data: bytes) -> bool:
        """Write `data` at the file's end, going on after a short write; False if it cannot all be written
        (the bytes that were are past `_end`, never read, and the next unit's overwrite them)."""
        done = 0
        while done < len(data):
            try:
                written = self._pwrite(fd, data[done:] if done else data, self._end + done)
            except OSError:
                return False
            if written <= 0:
                return False
            done += written
        return True

    def __getitem__(self, index: int) -> list[RequestRecord]:
        with self._lock:
            if index in self._memory:
                return self._memory[index]
            offset, size = self._where[index]  # KeyError: no records for this unit
            assert self._fd is not None
            data = os.pread(self._fd, size, offset)
        records: list[RequestRecord] = pickle.loads(data)  # our own bytes, written above
        return records

    def __contains__(self, index: object) -> bool:
        with self._lock:
            return index in self._where or index in self._memory

    def __iter__(self) -> Iterator[int]:
        with self._lock:  # a snapshot: other threads may add units meanwhile
            return iter([*self._where, *self._memory])

    def __len__(self) -> int:
        with self._lock:
            return len(self._where) + len(self._memory)

    def close(self) -> None:
        with self._lock:
            self._closer()
            self._fd = None
            self._where.clear()


RESERVE_BASE = 64 * 1024
RESERVE_PER_REQUEST = 512
RESERVE_MAX = 64 * 1024 * 1024


def reserve_size(requests: int) -> int:
    """The space a run of `requests` keeps back for its end: run.json and usage-summary.csv (a few KB),
    and results.csv (about 200 bytes a row, more with metadata columns), up to 64 MiB."""
    return min(RESERVE_MAX, RESERVE_BASE + RESERVE_PER_REQUEST * requests)


class DiskReserve:
    """Space in the output folder held back (a nameless, preallocated file) while a run sends, and given
    back when dispatch has ended (`release`), so that a run stopped by a full disk still has room for the
    records it writes at its end: run.json ("stopped") and usage-summary.csv always, results.csv up to
    about `reserve_size`'s rows. Where it cannot be made (no room even for it, or no `posix_fallocate`),
    the run goes on without it and its end says which files were not written."""

    def __init__(self, folder: Path, size: int) -> None:
        self._fd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            fd = _nameless_file(folder)
            try:
                os.posix_fallocate(fd, 0, size)  # blocks of its own: a sparse file would hold nothing
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        self._closer = weakref.finalize(self, _close, self._fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        self._closer()
        self._fd = None


def _nameless_file(folder: Path) -> int:
    """A file in `folder` with no name (it is gone when closed, or when the process dies)."""
    try:
        return os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o600)
    except (AttributeError, OSError):  # no O_TMPFILE here (not Linux, or its file system has none)
        fd, name = tempfile.mkstemp(dir=folder, prefix=".imagebatch-records-")
        os.unlink(name)
        return fd


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


@dataclass(eq=False)
class RunState:
    """What a run's threads change as it sends: the halt, the keys attempted, the 429s seen, each unit's
    records, and `--rpm`'s pacing. Thread-safe where threads share it (`halt`, `saw_429`, `results`)."""

    results: RecordSpool
    """Records of each finished unit, by unit index (tasks return nothing: Prefect keeps results)."""
    pace: Callable[[], object] | None = None
    """Waits for this request's start under `--rpm` (`run.pacing.Pacer.wait`); None: no pacing."""
    halt: threading.Event = field(default_factory=threading.Event)
    halt_reason: str | None = None
    started_keys: set[str] = field(default_factory=set)
    """Keys with an attempt started in this run."""
    rate_limited: int = 0
    """HTTP 429 answers seen so far (every attempt): dispatch narrows its window on a new one."""
    _count_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def saw_429(self) -> None:
        with self._count_lock:
            self.rate_limited += 1

    def stop(self, reason: str) -> None:
        """Send nothing more; the first reason given is the run's."""
        if not self.halt.is_set():
            self.halt_reason = reason
            self.halt.set()


@dataclass(frozen=True, eq=False)
class RunContext:
    """What every task of one run shares: its configuration, fixed for the run, and its `state`. Not passed
    to Prefect as a task input (the dispatcher's `RequestThreads` carries it), so Prefect never walks it."""

    client: GatewayClient
    store: OutputStore
    states: Mapping[str, KeyState]
    """The folder's state as the run found it."""
    state: RunState
    force: bool = False
    retry_unknown: bool = False
    held: frozenset[str] = frozenset()
    """Keys this run carries as they stand, whatever their state: variants, outside a `--redo` run."""
    key_source: str = ENV_API_KEY
    """Where the API key came from, for the message of a 401."""
    thumbnails: bool = True
    """Make each image's report thumbnail as it arrives."""

    def decision(self, key: str) -> Decision:
        """`send` it, `skip` it (succeeded before), or `carry` its last status (no_image, unknown)."""
        return decide(self.states.get(key), force=self.force, retry_unknown=self.retry_unknown,
                      held=key in self.held)  # fmt: skip


def stop_on_write_failure(store: OutputStore, state: RunState) -> None:
    """A failed write to the output location stops the run: the next request's writes would fail too."""
    store.backend.watch.on_error = lambda exc: state.stop(storage_message(store.where, exc))


def decide(
    state: KeyState | None, *, force: bool = False, retry_unknown: bool = False, held: bool = False
) -> Decision:
    """What a run does with a request whose key the journal left in `state` (None: never sent): `send`
    it, `skip` it (succeeded before), or `carry` its last status (no_image; unknown unless
    `retry_unknown`). `--force` sends everything. A `held` key (a variant, outside a `--redo` run:
    `work.variants`) is never sent: anything but a success is carried as it stands. The one rule, for a
    run and for `validate --out`."""
    status = state.status if state else None
    if held:
        return "skip" if status == "succeeded" else "carry"
    if force:
        return "send"
    if status == "succeeded":
        return "skip"
    if status == "no_image" or (status == "unknown" and not retry_unknown):
        return "carry"
    return "send"
