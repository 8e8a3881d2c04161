"""The run's plan: its units in order, with every variant of their requests, made again from the manifest's
jobs on each pass (`RunPlan`), so that no part of a run holds the whole plan: at about 1.3 KB a request,
a 500,000-request plan is most of a gigabyte.

A pass plans the jobs (`manifest.plan`), groups their requests into units as they come
(`work.context.group_units`), adds the variants the folder's state knows (`work.variants.Variants`) and,
for a shard, keeps its own units. Every pass yields the same units with the same indexes: the
dispatcher's pass sends them, the end's passes read their records back by index (`run.outputs`).
"""

from __future__ import annotations

import pickle
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from imagebatch.manifest import Job, PlannedRequest, plan
from imagebatch.work.context import Unit, group_units
from imagebatch.work.variants import Variants


class RunPlan:
    """The run's units, planned from `jobs` (iterated once per pass, never indexed) on each iteration.

    `count` makes the counting pass the run needs before it sends (run.json's `requests`, progress, the
    disk reserve, the budgets' shares), with the variants from then on."""

    def __init__(self, jobs: Iterable[Job], keep: Callable[[Unit], bool] | None = None) -> None:
        self.jobs = jobs
        self.keep = keep
        """Which units are this run's (a shard's own), or None: every unit."""
        self.variants: Variants | None = None
        self.units = 0
        """The units of the last counting pass (`count`)."""
        self.requests = 0
        """Their requests, each turn counted."""

    def __iter__(self) -> Iterator[Unit]:
        units = group_units(plan(self.jobs))
        if self.variants is not None:
            units = self.variants.units(units)
        if self.keep is None:
            return units
        keep = self.keep
        return (unit for unit in units if keep(unit))

    def count(self, variants: Variants | None = None) -> None:
        """Plan once with `variants` (which leaves its `held` keys and redo summary) and count the units
        and requests; every later pass yields those units."""
        self.variants = variants
        units = requests = 0
        for unit in self:
            units += 1
            requests += len(unit.requests)
        self.units, self.requests = units, requests


class PlanDetails(Mapping[str, PlannedRequest]):
    """The plan's requests by idempotency key (what the report shows of each: its prompt and files), in a
    SQLite table in a temporary folder of its own rather than in memory (about 0.6 KB a request there);
    leaving the `with` block removes it. Read from any thread."""

    def __init__(self, units: Iterable[Unit]) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="imagebatch-plan-")
        self.folder = Path(self._folder.name)
        """Where the table is, while the block runs."""
        self._db = sqlite3.connect(self.folder / "plan.sqlite", check_same_thread=False)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode = OFF")  # a scratch table: nothing to recover
        self._db.execute("PRAGMA synchronous = OFF")
        self._db.execute("CREATE TABLE plan (key TEXT NOT NULL, request BLOB NOT NULL)")
        rows = (
            (req.idempotency_key, pickle.dumps(req, protocol=pickle.HIGHEST_PROTOCOL))
            for unit in units
            for req in unit.requests
        )
        with self._db:
            self._db.executemany("INSERT INTO plan VALUES (?, ?)", rows)
            # The index built once all rows are in (sorted), faster than row by row at random keys.
            self._db.execute("CREATE INDEX plan_key ON plan (key)")

    def __getitem__(self, key: str) -> PlannedRequest:
        with self._lock:
            row = self._db.execute("SELECT request FROM plan WHERE key = ? LIMIT 1", (key,)).fetchone()
        if row is None:
            raise KeyError(key)
        request: PlannedRequest = pickle.loads(row[0])  # our own bytes, written above
        return request

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM plan WHERE key = ? LIMIT 1", (key,)).fetchone() is not None

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            keys = self._db.execute("SELECT DISTINCT key FROM plan ORDER BY key")
        while True:
            with self._lock:
                page = keys.fetchmany(1000)
            if not page:
                return
            yield from (key for (key,) in page)

    def __len__(self) -> int:
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(DISTINCT key) FROM plan").fetchone()
        return int(count)

    def __enter__(self) -> PlanDetails:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._db.close()
        self._folder.cleanup()
