"""A run's records of finished units, kept on disk while it sends (`RecordSpool`), and the disk space it
holds back for its end (`DiskReserve`): both nameless files in the output folder, gone when closed or when
the process dies."""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import tempfile
import threading
import weakref
from array import array
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from imagebatch.work.request_record import RequestRecord


class RecordSpool(Mapping[int, list[RequestRecord]]):
    """Each finished unit's records, by unit index, kept in a nameless temporary file in the output folder
    instead of in memory: a run keeps a record of every request until it writes results.csv at its end,
    about 0.8 KB each in memory (100,000 requests: 80 MB), 16 bytes a unit here (an offset and a length,
    in two arrays indexed by the unit's index: a run's unit indexes are dense from 0). Reading one back
    costs tens of microseconds.

    Where the file cannot be made or written (a full disk: an error, or a write cut short), records are
    kept in memory instead (a dict): they are never lost, and the journal has them anyway. A unit's records
    are in the file only once all their bytes are. Thread-safe; `close` drops the file. `pwrite` is
    `os.pwrite` (tests pass one that fails or writes short)."""

    def __init__(
        self, folder: Path | None = None, pwrite: Callable[[int, bytes, int], int] = os.pwrite
    ) -> None:
        self._pwrite = pwrite
        self._lock = threading.Lock()
        self._offsets = array("q")
        self._lengths = array("q")
        """Bytes of each unit's records in the file; 0: none there (a pickled list is never empty)."""
        self._in_file = 0
        self._memory: dict[int, list[RequestRecord]] = {}
        self._end = 0
        self._fd: int | None = None
        if folder is not None:
            with contextlib.suppress(OSError):
                self._fd = _nameless_file(folder)
        self._closer = weakref.finalize(self, _close, self._fd)  # a spool nobody closed, once collected

    def __setitem__(self, index: int, records: list[RequestRecord]) -> None:
        if index < 0:
            raise ValueError(f"a unit's index is 0 or more, not {index}")
        data = pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._memory.pop(index, None)
            if self._in_file_at(index):
                self._lengths[index] = 0
                self._in_file -= 1
            if self._fd is not None and self._write_whole(self._fd, data):
                if index >= len(self._lengths):
                    grown = bytes(8 * (index + 1 - len(self._lengths)))
                    self._offsets.frombytes(grown)
                    self._lengths.frombytes(grown)
                self._offsets[index], self._lengths[index] = self._end, len(data)
                self._in_file += 1
                self._end += len(data)
                return
            self._memory[index] = records

    def _in_file_at(self, index: object) -> bool:
        return isinstance(index, int) and 0 <= index < len(self._lengths) and self._lengths[index] > 0

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
            if not self._in_file_at(index):
                raise KeyError(index)
            assert self._fd is not None
            data = os.pread(self._fd, self._lengths[index], self._offsets[index])
        records: list[RequestRecord] = pickle.loads(data)  # our own bytes, written above
        return records

    def __contains__(self, index: object) -> bool:
        with self._lock:
            return self._in_file_at(index) or index in self._memory

    def __iter__(self) -> Iterator[int]:
        with self._lock:  # a snapshot (8 bytes a unit): other threads may add units meanwhile
            lengths, memory = self._lengths[:], list(self._memory)
        return itertools.chain((i for i, size in enumerate(lengths) if size), memory)

    def __len__(self) -> int:
        with self._lock:
            return self._in_file + len(self._memory)

    def close(self) -> None:
        with self._lock:
            self._closer()
            self._fd = None
            del self._offsets[:], self._lengths[:]
            self._in_file = 0


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
