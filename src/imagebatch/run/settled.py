"""A rerun that sends nothing, settled from the seal the last such rerun left while none of it changed.

`run.nothing_to_send` settles a rerun in full: it replays the journal, plans the manifest, decides every
key and writes results.csv, usage-summary.csv and run.json, all in proportion to the folder's size. When it
finds nothing to send it leaves a seal (`layout.SETTLED`): what it settled on (the records' stamp, a
digest of the plan's keys and metadata, the options that decide, imagebatch's version), the files its
records name, and what run.json said of those records (counts, usage, spend). A later rerun that finds
all of that unchanged, and every named file still there, would write the same results.csv and
usage-summary.csv: it writes only run.json (and the report, when asked), at the cost of reading the
manifest, planning it once and looking the files up. Anything else (a changed row, a deleted image, a
record written or edited since, another option, a seal that cannot be read) and the rerun is settled in
full, as without a seal: a seal is trusted only as far as it can be checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import imagebatch
from imagebatch.options import RunOptions
from imagebatch.run.outputs import run_info, write_summary
from imagebatch.run.plan import RunPlan
from imagebatch.run.preflight import Preflight
from imagebatch.storage import layout
from imagebatch.work.context import Unit
from imagebatch.work.store import OutputStore

NOT_STARTED = {"flow_run_id": None, "task_runs": 0, "started": False}
"""What run.json says of Prefect for a run settled without it (`run.nothing_to_send`)."""
SEAL_FORMAT = 2
"""The seal's layout: JSON Lines, a header (`settled_on`, `info`, the number of paths), then one JSON
string a path. A seal of another format is not trusted (the rerun settles in full and leaves a new one)."""
CHUNK = 1000
"""How many of the seal's paths are looked up at once: memory holds that many, whatever the run's size."""
CARRIED = ("requests", "usage", "spend", "rate_limited", "counts", "superseded")
"""What run.json says of the records, carried from the seal into a rerun settled from it."""


class PlanDigest:
    """A digest of the plan as results.csv depends on it: the metadata columns, then each request's key
    and its job's metadata, in the plan's order."""

    def __init__(self, metadata_columns: Iterable[str]) -> None:
        self._hash = hashlib.sha256(json.dumps(list(metadata_columns)).encode())

    def add(self, unit: Unit) -> None:
        metadata = repr(sorted(unit.job.metadata.items())).encode()
        for req in unit.requests:
            self._hash.update(f"{req.idempotency_key}\0".encode() + metadata + b"\n")

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


class PathSpool:
    """The files a rerun being settled in full names, one JSON string a line in a nameless temporary file
    (in `folder`, else the machine's temporary folder) as they come, for the seal: a 500,000-request
    rerun's paths would be tens of megabytes in memory. A file that cannot be made or written only means
    no seal (`broken`). `close` drops the file."""

    def __init__(self, folder: Path) -> None:
        self.count = 0
        self.broken = False
        self._fh: BinaryIO | None = None
        try:
            self._fh = _nameless(folder)
        except OSError:
            self.broken = True

    def add(self, paths: Iterable[str]) -> None:
        """Keep `paths`, after those kept so far."""
        if self._fh is None or self.broken:
            return
        lines = [json.dumps(path).encode() + b"\n" for path in paths]
        try:
            self._fh.writelines(lines)
        except OSError:
            self.broken = True
        self.count += len(lines)

    def copy_to(self, out: BinaryIO) -> None:
        """Write every path kept, in order, to `out`."""
        if self._fh is None or self.broken:
            raise OSError("the seal's paths were not all kept")
        self._fh.flush()
        self._fh.seek(0)
        shutil.copyfileobj(self._fh, out)

    def close(self) -> None:
        """Drop the file (its paths with it)."""
        if self._fh is not None:
            self._fh.close()


def _nameless(folder: Path) -> BinaryIO:
    """A file with no name (gone when closed, or when the process dies) in `folder`, else in the
    machine's temporary folder (a location this user may only read, or none on this disk)."""
    with contextlib.suppress(OSError):
        if folder.is_dir():
            return tempfile.TemporaryFile(dir=folder, prefix=".imagebatch-seal-")
    return tempfile.TemporaryFile(prefix="imagebatch-seal-")


def settled_on(
    checked: Preflight, options: RunOptions, store: OutputStore, plan_digest: str
) -> dict[str, Any]:
    """Everything a settled rerun's records follow from, besides the files they name (JSON as stored)."""
    prices = checked.prices
    inputs = {
        "format": SEAL_FORMAT,
        "imagebatch": imagebatch.__version__,
        "records": store.backend.records_stamp(),
        "manifest_sha256": checked.manifest.sha256,
        "plan": plan_digest,
        "retry_unknown": options.resend.retry_unknown,
        "prices": None if prices is None else {"images": prices.images, "currency": prices.currency},
    }
    loaded: dict[str, Any] = json.loads(json.dumps(inputs))
    return loaded


def leave_seal(
    checked: Preflight,
    options: RunOptions,
    store: OutputStore,
    plan_digest: str,
    paths: PathSpool,
    info: dict[str, Any],
) -> None:
    """Write the seal of a rerun just settled in full (its records written: a record not written leaves
    none), streamed: its header, then the paths from their spool. Best effort: a seal not written only
    means the next rerun is settled in full."""
    if info.get("unwritten") or paths.broken:
        return
    header = {
        "settled_on": settled_on(checked, options, store, plan_digest),
        "info": {name: info[name] for name in CARRIED if name in info},
        "paths": paths.count,
    }
    with contextlib.suppress(OSError), store.backend.replacing(layout.SETTLED) as out:
        out.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
        paths.copy_to(out)


def settle_from_seal(checked: Preflight, options: RunOptions, store: OutputStore) -> dict[str, Any] | None:
    """The run's summary, run.json (and the report) written, if the seal still holds; else None (settle
    in full). The cheap checks first (the seal's header: the records' stamp, the options), then one pass
    of the plan, then the files, `CHUNK` paths at a time as the seal is read. `--redo` and `--edit` never
    settle from it (they read review decisions)."""
    resend = options.resend
    if resend.redo is not None or resend.edit:
        return None
    header = _header(store)
    if header is None:
        return None
    expected = header["settled_on"]
    if settled_on(checked, options, store, expected.get("plan", "")) != expected:
        return None
    plan = RunPlan(checked.manifest.jobs)
    digest = PlanDigest(checked.manifest.metadata_columns)
    for unit in plan:
        digest.add(unit)
    if digest.hexdigest() != expected["plan"] or not _files_there(store, header):
        return None
    info = run_info(checked, header["info"]["requests"], options) | header["info"]
    info["sent"] = 0
    return write_summary(store, plan, info, None, options.outcome.report, dict(NOT_STARTED), [])


def _header(store: OutputStore) -> dict[str, Any] | None:
    """The seal's header (its first line), or None when there is no seal or it is not one this code
    wrote. Only that line is read."""
    try:
        with contextlib.closing(store.backend.read_lines(layout.SETTLED)) as lines:
            first = next(lines, None)
        header = json.loads(first) if first is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict) or not isinstance(header.get("settled_on"), dict):
        return None
    count, info = header.get("paths"), header.get("info")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return None
    if not isinstance(info, dict) or not isinstance(info.get("requests"), int):
        return None
    return header


def _files_there(store: OutputStore, header: dict[str, Any]) -> bool:
    """Whether the seal still begins with `header` and then names exactly as many paths as it says, each
    a string and each file there: read again as a stream, looked up `CHUNK` at a time."""
    try:
        with contextlib.closing(store.backend.read_lines(layout.SETTLED)) as lines:
            first = next(lines, None)
            if first is None or json.loads(first) != header:
                return False
            return _all_there(store, lines, header["paths"])
    except (OSError, ValueError):
        return False


def _all_there(store: OutputStore, lines: Iterator[bytes], count: int) -> bool:
    """Whether `lines` are `count` JSON strings naming files that are all there (ValueError for a line
    that is not JSON)."""
    seen, chunk = 0, []
    for line in lines:
        path = json.loads(line)
        seen += 1
        if not isinstance(path, str) or seen > count:
            return False
        chunk.append(path)
        if len(chunk) == CHUNK:
            if not store.backend.files_exist(chunk, True):
                return False
            chunk = []
    return seen == count and store.backend.files_exist(chunk, True)
