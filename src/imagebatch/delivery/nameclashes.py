"""Collisions among any number of names, found in a nameless SQLite file rather than in memory
(`NameClashes`): `naming.clashes`' rule for a stream of names, such as every row of a manifest of
500,000 (`validate --name`).

The file is made in the machine's temporary folder and unlinked as soon as it is open (as
`work.stateindex` makes its own): nothing is left behind, not even by a process killed mid-check, and the
output location is never written.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from types import TracebackType

from imagebatch.delivery.naming import folded

BATCH = 5000
"""Names written to the file at a time: what of them is in memory."""
CACHE_KIB = 8192
"""SQLite's page cache, in KiB."""
_SCHEMA = (
    "CREATE TABLE names (seq INTEGER PRIMARY KEY, label TEXT NOT NULL, name TEXT NOT NULL, key TEXT)",
    "CREATE TABLE folders (seq INTEGER NOT NULL, depth INTEGER NOT NULL, folder TEXT NOT NULL)",
)
_FIRSTS = (
    "CREATE INDEX names_key ON names (key, seq)",
    "CREATE TABLE firsts (key TEXT PRIMARY KEY, seq INTEGER NOT NULL, label TEXT NOT NULL) WITHOUT ROWID",
    "INSERT INTO firsts SELECT key, seq, label FROM names n "
    "WHERE seq = (SELECT MIN(seq) FROM names WHERE key = n.key)",
)
_SAME = """SELECT f.label, n.label, n.name FROM names n JOIN firsts f ON f.key = n.key
WHERE n.seq != f.seq ORDER BY n.seq"""
_FOLDER = """SELECT f.label, n.label, n.name FROM folders d JOIN firsts f ON f.key = d.folder
JOIN names n ON n.seq = d.seq ORDER BY d.seq, d.depth"""


class NameClashes:
    """Names added a label (the row it comes from) and its rendered name at a time (`add`), then the pairs
    of labels whose names are one file, or where one is a folder of the other (`found`), in the order and
    form of `naming.clashes` (its labels unique, as that mapping's keys are). Use it as a context manager:
    the file is closed on the way out."""

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="imagebatch-names-", suffix=".tmp")
        os.close(fd)
        try:
            self._db = sqlite3.connect(path, isolation_level=None)
        finally:
            os.unlink(path)  # the open connection keeps the file; nothing is left under any name
        for pragma in ("journal_mode=OFF", "synchronous=OFF", f"cache_size=-{CACHE_KIB}"):
            self._db.execute(f"PRAGMA {pragma}")
        for statement in _SCHEMA:
            self._db.execute(statement)
        self._pending: list[tuple[str, str]] = []
        self._seq = 0

    def __enter__(self) -> NameClashes:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._db.close()

    def add(self, label: str, name: str) -> None:
        self._pending.append((label, name))
        if len(self._pending) >= BATCH:
            self._flush()

    def found(self) -> Iterator[tuple[str, str, str]]:
        """(the first label, the other label, the other's name): first every name that is another's, then
        every name under a folder that is another's name, each in the order the names were added."""
        self._flush()
        for statement in _FIRSTS:
            self._db.execute(statement)
        for query in (_SAME, _FOLDER):
            rows = self._db.execute(query)
            while page := rows.fetchmany(BATCH):
                yield from page

    def _flush(self) -> None:
        names, folders = [], []
        for label, name in self._pending:
            self._seq += 1
            key = folded(name)
            names.append((self._seq, label, name, key))
            parts = key.split("/")
            folders += [(self._seq, depth, "/".join(parts[:depth])) for depth in range(1, len(parts))]
        self._db.execute("BEGIN")
        self._db.executemany("INSERT INTO names VALUES (?, ?, ?, ?)", names)
        self._db.executemany("INSERT INTO folders VALUES (?, ?, ?)", folders)
        self._db.execute("COMMIT")
        self._pending = []
