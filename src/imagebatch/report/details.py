"""What a card shows of its planned request (prompt, reference images, mask), by idempotency key, from an
index on disk: the report and the review look a key up a page at a time instead of holding the plan.

`PlanDetails` is a read-only `Mapping[str, Shown]` over a private SQLite file (`sqlite3.connect("")`:
made in the temporary directory and removed when the index is closed or collected), filled from an
iterable of planned requests as it is read (`index_details`), so that memory holds one request at a time
however large the plan; `manifest_details` makes one from the manifest run.json names, jobs read and
planned one at a time.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imagebatch.manifest.sources import is_url
from imagebatch.work.runsummary import RunSummary

if TYPE_CHECKING:
    from imagebatch.manifest import PlannedRequest

BATCH = 2_000
"""Rows written to the index per statement."""


@dataclass(frozen=True, slots=True)
class Shown:
    """What a card shows of a planned request (the attributes of `PlannedRequest` it reads)."""

    prompt: str
    reference_images: list[Path | str]
    """Local files as paths, objects as their URLs (as the plan names them)."""
    mask: Path | str | None = None


def _file_ref(text: str) -> Path | str:
    return text if is_url(text) else Path(text)


class PlanDetails(Mapping[str, Shown]):
    """The planned requests' `Shown`, by key, in a SQLite index on disk. Safe to read from several
    threads (one statement at a time)."""

    def __init__(self) -> None:
        self._db = sqlite3.connect("", check_same_thread=False)
        self._db.execute("CREATE TABLE shown (key TEXT PRIMARY KEY, prompt TEXT, refs TEXT, mask TEXT)")
        self._lock = threading.Lock()

    def add(self, requests: Iterable[PlannedRequest]) -> PlanDetails:
        """Index `requests` (the first of a key is kept, as a dict built over a plan keeps the last:
        a plan's keys are unique)."""
        batch: list[tuple[str, str, str, str | None]] = []
        for req in requests:
            refs = json.dumps([str(ref) for ref in req.reference_images])
            batch.append((req.idempotency_key, req.prompt, refs, None if req.mask is None else str(req.mask)))
            if len(batch) >= BATCH:
                self._insert(batch)
                batch = []
        self._insert(batch)
        return self

    def _insert(self, batch: list[tuple[str, str, str, str | None]]) -> None:
        with self._lock, self._db:
            self._db.executemany("INSERT OR IGNORE INTO shown VALUES (?, ?, ?, ?)", batch)

    def __getitem__(self, key: str) -> Shown:
        with self._lock:
            found = self._db.execute("SELECT prompt, refs, mask FROM shown WHERE key = ?", (key,)).fetchone()
        if found is None:
            raise KeyError(key)
        prompt, refs, mask = found
        return Shown(
            prompt, [_file_ref(ref) for ref in json.loads(refs)], None if mask is None else _file_ref(mask)
        )

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM shown WHERE key = ?", (key,)).fetchone() is not None

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM shown").fetchone()[0])

    def __iter__(self) -> Iterator[str]:
        last = ""
        while True:
            with self._lock:
                keys = [k for (k,) in self._db.execute(
                    "SELECT key FROM shown WHERE key > ? ORDER BY key LIMIT ?", (last, BATCH)
                )]  # fmt: skip
            yield from keys
            if len(keys) < BATCH:
                return
            last = keys[-1]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> PlanDetails:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def index_details(requests: Iterable[PlannedRequest]) -> PlanDetails:
    """An on-disk index of `requests` (a plan, read once), for `build_report(details=...)`."""
    return PlanDetails().add(requests)


def manifest_details(run: RunSummary | None) -> Mapping[str, Shown]:
    """Prompts and files by idempotency key, from the manifest run.json names if it is unchanged (empty
    otherwise: a manifest that moved, changed or no longer loads only costs the cards their prompts)."""
    if run is None or not run.manifest:
        return {}
    from imagebatch.manifest import load_manifest, plan_job
    from imagebatch.manifest.read import split_sheet

    source = run.manifest
    try:
        roots = run.options.get("files_root")  # the folders the run was allowed to read
        if is_url(source):  # a manifest in a bucket: loaded, and compared, from there
            manifest = load_manifest(source, files_root=roots)
            if manifest.sha256 != run.manifest_sha256:
                return {}
        else:
            path, sheet = split_sheet(Path(source))  # a workbook's: `catalog.xlsx#Sheet`
            if not path.is_file() or _sha256(path) != run.manifest_sha256:
                return {}
            manifest = load_manifest(path, files_root=roots, sheet=sheet)
        return index_details(req for job in manifest.jobs for req in plan_job(job))
    except Exception:
        return {}


def _sha256(path: Path) -> str:
    """The file's SHA-256, read a megabyte at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
