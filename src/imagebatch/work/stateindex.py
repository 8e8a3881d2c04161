"""The replayed state of every idempotency key (`work.replay`'s `KeyState`), kept where a run can afford
it: in memory for a folder of few keys, else in an SQLite file on disk, so that a rerun of a folder of any
size holds a bounded part of it in memory (bench/README.md, "The folder's state on disk").

The file is made in the location's spool folder (`Backend.spool_folder`: the output folder itself, or the
machine's temporary folder for a bucket) and unlinked as soon as it is open: no name is left behind, even by
a process killed mid-run, and the disk space returns when the index is dropped. Nothing but this process
ever opens it, so it is written without a rollback journal or syncs.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import threading
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping, ValuesView
from pathlib import Path
from typing import Generic, TypeVar

State = TypeVar("State")
"""What the index holds of each key (the replay's `KeyState`)."""

Request = tuple[str, int, int]
"""(job_id, request_index, turn_index): a request, whose variants share it."""

PAGE = 1000
"""Rows read at a time when the index is walked (`items`, `values`, iteration): a bounded batch each."""
_PAGE_QUERY = "SELECT rowid, key, state FROM states WHERE rowid > ? ORDER BY rowid LIMIT ?"
CACHE_KIB = 8192
"""SQLite's page cache for the file, in KiB: what of it may stay in memory."""


class StateFile(Generic[State]):
    """The on-disk table of key states: one row per key, its state as `encode` makes it bytes (a private
    file: only the process that wrote it reads it back, `decode`). Safe to share between threads."""

    def __init__(
        self, folder: Path | None, encode: Callable[[State], bytes], decode: Callable[[bytes], State]
    ) -> None:
        self._encode, self._decode = encode, decode
        fd, name = _made(folder)
        os.close(fd)
        try:
            self._db = sqlite3.connect(name, check_same_thread=False, isolation_level=None)
        finally:
            os.unlink(name)  # the open connection keeps the file; nothing is left under any name
        self._lock = threading.Lock()
        for pragma in ("journal_mode=OFF", "synchronous=OFF", f"cache_size=-{CACHE_KIB}"):
            self._db.execute(f"PRAGMA {pragma}")
        self._db.execute("CREATE TABLE states (key TEXT PRIMARY KEY, state BLOB NOT NULL)")

    def put(self, states: Iterable[tuple[str, State]]) -> None:
        """Write (or overwrite) these keys' states in one transaction; a key keeps its place in the walk."""
        rows = [(key, self._encode(st)) for key, st in states]
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO states VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET state = excluded.state", rows
            )
            self._db.execute("COMMIT")

    def get(self, key: str) -> State | None:
        with self._lock:
            row = self._db.execute("SELECT state FROM states WHERE key = ?", (key,)).fetchone()
        return None if row is None else self._decode(row[0])

    def has(self, key: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM states WHERE key = ?", (key,)).fetchone() is not None

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM states").fetchone()[0])

    def pages(self) -> Iterator[list[tuple[str, bytes]]]:
        """Every row, in the order the keys were first written, `PAGE` rows at a time: each page read under
        the lock, so other threads' look-ups go on between pages, and a row rewritten meanwhile is not
        walked twice."""
        last = 0
        while True:
            with self._lock:
                page = self._db.execute(_PAGE_QUERY, (last, PAGE)).fetchall()
            if not page:
                return
            last = page[-1][0]
            yield [(key, state) for _, key, state in page]

    def states(self) -> Iterator[tuple[str, State]]:
        for page in self.pages():
            for key, state in page:
                yield key, self._decode(state)

    def rewrite(self, change: Callable[[State], bool]) -> None:
        """Walk every state, and write back those `change` changed (True), a page at a time."""
        for page in self.pages():
            changed = []
            for key, blob in page:
                st = self._decode(blob)
                if change(st):
                    changed.append((key, st))
            if changed:
                self.put(changed)

    def close(self) -> None:
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._db.close()


def _made(folder: Path | None) -> tuple[int, str]:
    """A new file in `folder`, or in the machine's temporary folder when `folder` is none, not a folder,
    or refuses one (a location this user may only read)."""
    with contextlib.suppress(OSError):
        if folder is not None and folder.is_dir():
            return tempfile.mkstemp(prefix=".imagebatch-state-", suffix=".tmp", dir=folder)
    return tempfile.mkstemp(prefix="imagebatch-state-", suffix=".tmp")


class StateIndex(Mapping[str, State]):
    """Read-only: each key's state, from memory (`held`) or from a `StateFile`; `newest` the newest variant
    the journal knows of each request it holds a variant of (few: only `--redo` runs make them). Safe to
    read from several threads."""

    def __init__(
        self, held: dict[str, State] | None, file: StateFile[State] | None, newest: dict[Request, int]
    ) -> None:
        self._held = held
        self._file = file
        self._len = len(held) if held is not None else (file.count() if file is not None else 0)
        self.newest: Mapping[Request, int] = newest

    @property
    def on_disk(self) -> bool:
        """Whether the states are in a file rather than in memory."""
        return self._file is not None

    def get(self, key: str, default: State | None = None) -> State | None:  # type: ignore[override]
        if self._held is not None:
            return self._held.get(key, default)
        found = self._file.get(key) if self._file is not None else None
        return default if found is None else found

    def __getitem__(self, key: str) -> State:
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if self._held is not None:
            return key in self._held
        return self._file is not None and self._file.has(key)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._walk())

    def items(self) -> ItemsView[str, State]:
        return _Items(self)

    def values(self) -> ValuesView[State]:
        return _Values(self)

    def _walk(self) -> Iterator[tuple[str, State]]:
        if self._held is not None:
            yield from self._held.items()
        elif self._file is not None:
            yield from self._file.states()

    def close(self) -> None:
        """Let go of the file now rather than when the index is dropped."""
        if self._file is not None:
            self._file.close()


class _Items(ItemsView[str, State]):
    """The index's items, streamed from its file page by page (not a look-up per key)."""

    _mapping: StateIndex[State]

    def __iter__(self) -> Iterator[tuple[str, State]]:
        return self._mapping._walk()


class _Values(ValuesView[State]):
    _mapping: StateIndex[State]

    def __iter__(self) -> Iterator[State]:
        return (st for _, st in self._mapping._walk())
