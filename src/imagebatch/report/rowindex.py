"""results.csv's rows in an index on disk, read back a request at a time: what the report's summary and
the review's cards work out per request (its variants: which replaced which, its best status) without a
dict over every request in memory.

A `RowIndex` is a private SQLite file (`sqlite3.connect("")`: made in the temporary directory, removed
when the index is closed or collected). Each row is added with its request, its group's value (the review's
`--group-by`) and whether the caller keeps it (a card: `kept`); `requests` gives the kept rows back a
request at a time, in the order the review shows them.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterator, Mapping
from typing import Any

from imagebatch.report.setstate import request_of

BATCH = 2_000
"""Rows written per statement, and keys read per query."""

_ORDERED = """
WITH head AS (
    SELECT job, req, turn, MIN(ord) AS first FROM rows WHERE kept GROUP BY job, req, turn
), grouped AS (
    SELECT head.*, rows.grp AS grp FROM head JOIN rows ON rows.ord = head.first
), firsts AS (
    SELECT grp, MIN(first) AS at FROM grouped GROUP BY grp
), jobs AS (
    SELECT job, COUNT(DISTINCT req) > 1 AS several FROM grouped GROUP BY job
)
SELECT grouped.first, jobs.several, rows.row FROM rows
JOIN grouped USING (job, req, turn) JOIN firsts USING (grp) JOIN jobs USING (job)
WHERE rows.kept ORDER BY firsts.at, grouped.first, rows.ord
"""
"""The kept rows, their requests together: groups in the order of their first request, requests in the
order of their first row, a request's rows in results.csv's order; with whether the row's job has several
requests with rows kept."""


class RowIndex:
    """results.csv's rows (each as the dict the caller keeps of it) on disk, in the order added."""

    def __init__(self) -> None:
        self._db = sqlite3.connect("")
        self._db.execute(
            "CREATE TABLE rows (ord INTEGER PRIMARY KEY, job TEXT, req TEXT, turn TEXT, grp TEXT, "
            "key TEXT, kept INTEGER, replaced INTEGER DEFAULT 0, row TEXT)"
        )
        self._batch: list[tuple[Any, ...]] = []
        self._count = 0

    def add(
        self, row: Mapping[str, str], kept: bool, group: str = "", stored: Mapping[str, Any] | None = None
    ) -> int:
        """Add `row` (its request, key and `stored`, by default the row itself); returns its number (0 the
        first)."""
        job, req, turn = request_of(row)
        data = json.dumps(row if stored is None else stored, separators=(",", ":"))
        self._batch.append((self._count, job, req, turn, group, row["idempotency_key"], int(kept), data))
        if len(self._batch) >= BATCH:
            self._flush()
        self._count += 1
        return self._count - 1

    def _flush(self) -> None:
        with self._db:
            self._db.executemany("INSERT INTO rows (ord, job, req, turn, grp, key, kept, row) "
                                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", self._batch)  # fmt: skip
        self._batch = []

    def done(self) -> RowIndex:
        """Every row added: index them by request and by key."""
        self._flush()
        with self._db:
            self._db.execute("CREATE INDEX request ON rows (job, req, turn, ord)")
            self._db.execute("CREATE INDEX keys ON rows (key)")
        return self

    def requests(self) -> Iterator[tuple[list[dict[str, Any]], bool]]:
        """The kept rows a request at a time (`_ORDERED`), each request's with whether its job has several
        requests."""
        found = self._db.execute(_ORDERED)
        batches = iter(lambda: found.fetchmany(BATCH), [])
        flat = itertools.chain.from_iterable(batches)
        for _, request in itertools.groupby(flat, key=lambda r: r[0]):
            got = list(request)
            yield [json.loads(r[2]) for r in got], bool(got[0][1])

    def __contains__(self, key: object) -> bool:
        """Whether some row (kept or not) has the idempotency key `key`."""
        return self._db.execute("SELECT 1 FROM rows WHERE key = ? LIMIT 1", (key,)).fetchone() is not None

    def mark_replaced(self, keys: set[str]) -> None:
        """Mark the rows of `keys` as replaced by a newer variant (`setstate.superseded`)."""
        with self._db:
            self._db.executemany("UPDATE rows SET replaced = 1 WHERE key = ?", ((k,) for k in keys))

    def replaced(self, first: int, last: int) -> set[str]:
        """The keys of rows `first` to `last` (their numbers, `add`'s) marked replaced."""
        query = "SELECT key FROM rows WHERE replaced AND ord BETWEEN ? AND ?"
        return {key for (key,) in self._db.execute(query, (first, last))}

    def close(self) -> None:
        self._db.close()
