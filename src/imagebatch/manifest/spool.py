"""A manifest's checked jobs kept in a nameless temporary file rather than in memory (`Jobs`).

A job in memory costs about 1 KB; a 500,000-row manifest's jobs would be half a gigabyte in every process
that reads it (`validate`, each shard of a sharded run). `JobSpool` writes the jobs as they are checked, a
chunk of `CHUNK` at a time (one pickle of their fields' values: the values a chunk's jobs share, a model's
name or a reference image's path, are written once), and `Jobs` reads them back in manifest order, chunk by
chunk, as often as it is iterated: what is held is one chunk and each chunk's offset.

A manifest of at most one chunk of jobs stays in memory (no file is made for it). Where the file cannot be
made or written (no temporary folder, a full disk), the chunks from there on stay in memory: a job is
never lost, only held.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import overload

from .models import Job, job_of

CHUNK = 1024
"""Jobs a chunk: the file's unit of writing and reading, and the most jobs kept in memory without one."""

Chunk = tuple[int, int] | list[Job]
"""A chunk in the file (its offset and length) or in memory (its jobs)."""


def _encode(jobs: list[Job]) -> bytes:
    """A chunk's jobs as one pickle of their fields' values (each a dict in Job's order of fields: a
    dict's keys, the same strings in every job, are written once)."""
    return pickle.dumps([job.__dict__ for job in jobs], protocol=pickle.HIGHEST_PROTOCOL)


def _decode(data: bytes) -> list[Job]:
    """A chunk's jobs from its bytes (our own, written by `_encode`)."""
    return [job_of(values) for values in pickle.loads(data)]


class Jobs(Sequence[Job]):
    """A manifest's jobs in manifest order: iterated (as often as wanted, from any thread), counted,
    indexed. Made by `JobSpool`, or from a list (`of`), which it then holds as it is."""

    def __init__(self, chunks: list[Chunk], count: int, fd: int | None = None) -> None:
        self._chunks = chunks
        self._count = count
        self._fd = fd
        self._last: tuple[int, list[Job]] = (-1, [])
        """The chunk read last, by index: `jobs[0]`, `jobs[1]`, ... read one chunk, not one each."""
        self._closer = weakref.finalize(self, _close, fd)

    @classmethod
    def of(cls, jobs: Iterable[Job]) -> Jobs:
        """`jobs` as they are if they already are `Jobs`, else held in memory."""
        if isinstance(jobs, Jobs):
            return jobs
        held = list(jobs)
        return cls([held], len(held))

    @property
    def on_disk(self) -> bool:
        """Whether any chunk is in the temporary file."""
        return any(isinstance(chunk, tuple) for chunk in self._chunks)

    def _chunk(self, index: int) -> list[Job]:
        chunk = self._chunks[index]
        if isinstance(chunk, list):
            return chunk
        last = self._last
        if last[0] == index:
            return last[1]
        assert self._fd is not None
        offset, size = chunk
        jobs = _decode(os.pread(self._fd, size, offset))
        self._last = (index, jobs)
        return jobs

    def __iter__(self) -> Iterator[Job]:
        for index in range(len(self._chunks)):
            yield from self._chunk(index)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Job: ...

    @overload
    def __getitem__(self, index: slice) -> list[Job]: ...

    def __getitem__(self, index: int | slice) -> Job | list[Job]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("job index out of range")
        if len(self._chunks) == 1:
            return self._chunk(0)[index]
        return self._chunk(index // CHUNK)[index % CHUNK]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable-looking and compared by value, like a list

    def __repr__(self) -> str:
        where = "on disk" if self.on_disk else "in memory"
        return f"Jobs({self._count} jobs, {where})"

    def __reduce__(self) -> tuple[Callable[[Iterable[Job]], Jobs], tuple[list[Job]]]:
        return Jobs.of, (list(self),)  # to another process: the jobs themselves, not our file


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


Pwrite = Callable[[int, bytes, int], int]


class JobSpool:
    """Writes jobs as they come (`add`), `CHUNK` at a time, into a nameless file in `folder` (the system's
    temporary folder by default); `jobs` ends the writing and returns them. `pwrite` is `os.pwrite` (tests
    pass one that fails or writes short)."""

    def __init__(self, folder: str | None = None, pwrite: Pwrite = os.pwrite) -> None:
        self._folder = folder
        self._pwrite = pwrite
        self._chunks: list[Chunk] = []
        self._pending: list[Job] = []
        self._count = 0
        self._end = 0
        self._fd: int | None = None
        self._failed = False
        """The file could not be made or written: the rest stays in memory."""

    def add(self, job: Job) -> None:
        if len(self._pending) == CHUNK:  # written once a job beyond it comes: one chunk needs no file
            self._flush()
        self._pending.append(job)
        self._count += 1

    def extend(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            self.add(job)

    def _flush(self) -> None:
        chunk, self._pending = self._pending, []
        if not self._failed and (at := self._write(_encode(chunk))) is not None:
            self._chunks.append(at)
        else:
            self._chunks.append(chunk)

    def _write(self, data: bytes) -> tuple[int, int] | None:
        """Where `data` now is in the file (made at the first chunk), or None when it cannot all be
        written there (a short write's bytes are past the end, never read)."""
        try:
            if self._fd is None:
                with tempfile.TemporaryFile(dir=self._folder, prefix="imagebatch-jobs-") as file:
                    self._fd = os.dup(file.fileno())  # nameless (O_TMPFILE, or unlinked at once)
            done = 0
            while done < len(data):
                written = self._pwrite(self._fd, data[done:] if done else data, self._end + done)
                if written <= 0:
                    raise OSError("a write made no progress")
                done += written
        except OSError:
            self._failed = True
            return None
        at = (self._end, len(data))
        self._end += len(data)
        return at

    def jobs(self) -> Jobs:
        """The jobs added, in order; a single chunk's stay in memory, with no file."""
        if self._pending:
            if not self._chunks:
                self._chunks.append(self._pending)
                self._pending = []
            else:
                self._flush()
        return Jobs(self._chunks, self._count, self._fd)

    def discard(self) -> None:
        """Drop what was written (the file is closed): for a manifest refused after all."""
        _close(self._fd)
        self._fd = None
        self._chunks, self._pending = [], []
