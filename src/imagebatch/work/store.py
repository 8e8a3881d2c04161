"""The output location (a local folder, or an object store's prefix): the source of truth for what has
been done, as one facade, `OutputStore`, over its parts: who holds it (`work.holds`), the write-ahead
journal and usage ledger (`work.journal`), their replay into each key's state (`work.replay`) and the
files (`work.outputfiles`). Its bytes go through the storage seam (`storage.location.Location`); the
files' names are `storage.layout`'s, and README "The output folder" describes them.

A rerun reads the journal, not Prefect's database, so a copied output location resumes correctly.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagebatch.storage import layout
from imagebatch.storage.appendlog import AppendLog, WriteWatch, read_jsonl
from imagebatch.storage.bounded import BadLine
from imagebatch.storage.kinds import open_location
from imagebatch.storage.location import (
    LocalFolder,
    Location,
    OutputLockedError,
    atomic_file,
    write_atomic,
)
from imagebatch.work.holds import Holds
from imagebatch.work.journal import Journal
from imagebatch.work.outputfiles import OutputFiles
from imagebatch.work.replay import KeyState, replay
from imagebatch.work.request_record import RESULT_COLUMNS, STATUSES, RequestRecord, Status, file_stem
from imagebatch.work.runsummary import RunSummary, read_summary

if TYPE_CHECKING:
    from imagebatch.manifest import PlannedRequest

__all__ = [
    "RESULT_COLUMNS",
    "STATUSES",
    "KeyState",
    "OutputLockedError",
    "OutputStore",
    "RequestRecord",
    "Status",
    "atomic_file",
    "file_stem",
    "read_jsonl",
    "write_atomic",
]


class OutputStore:
    """Reads and writes one output location. Safe to share between the threads of one run.

    `shard`: `I-of-N` for one shard of a sharded run (its own journal and usage file), else None.
    `clock`: the wall clock an object store's lease is timed by (tests inject one)."""

    def __init__(
        self, root: Path | str, shard: str | None = None, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.location: Location = open_location(root)
        self.where = self.location.url
        """The location as messages name it: a folder's path, or `s3://bucket/prefix` (no credential)."""
        self._folder = self.location.root if isinstance(self.location, LocalFolder) else None
        self.clock, self.shard = clock, shard
        self._watch = WriteWatch()
        self.log = AppendLog(self._watch)
        self.holds = Holds(self.location, self._folder, shard, self._watch, clock)
        self.wal = Journal(self.holds, self.log, shard)
        self.journal_path, self.usage_path = self.wal.journal_path, self.wal.usage_path
        self.files = OutputFiles(self.holds, self.log, shard)
        self.images_dir, self.chains_dir = self.files.images_dir, self.files.chains_dir
        self.conversations_path = self.files.conversations_path
        self.results_path, self.run_path = self.files.results_path, self.files.run_path

    @property
    def root(self) -> Path:
        """The local folder (an object store has none: what needs one asks the store instead)."""
        return self.holds.root

    @property
    def is_object_store(self) -> bool:
        return self._folder is None

    @property
    def spool_folder(self) -> Path:
        """Where the run keeps its records until results.csv is written: the folder, or the machine's
        temporary folder for an object store."""
        return self._folder or Path(tempfile.gettempdir())

    @property
    def write_error(self) -> OSError | None:
        """The first write that failed (a full disk, ...): the run stops dispatching at it."""
        return self._watch.error

    @property
    def on_write_error(self) -> Callable[[OSError], None] | None:
        return self._watch.on_error

    @on_write_error.setter
    def on_write_error(self, callback: Callable[[OSError], None] | None) -> None:
        self._watch.on_error = callback

    # -- holds (work.holds) --

    def hold_and_merge(self) -> AbstractContextManager[None]:
        return self.holds.hold_and_merge()

    def hold_sharded(self, shards: int) -> AbstractContextManager[None]:
        return self.holds.hold_sharded(shards)

    def shard_hold(self) -> AbstractContextManager[None]:
        return self.holds.shard_hold()

    def in_use(self) -> str | None:
        return self.holds.in_use()

    def shard_held(self, shard: str) -> bool:
        return self.holds.shard_held(shard)

    def merge_shards(self) -> int:
        return self.holds.merge_shards()

    # -- journal, usage and replay (work.journal, work.replay) --

    def journal(self, event: str, *, sync: bool = True, **fields: Any) -> None:
        self.wal.write(event, sync=sync, **fields)

    def record_outcome(self, record: RequestRecord) -> None:
        self.wal.record_outcome(record)

    def append_usage(self, record: dict[str, Any]) -> None:
        self.wal.append_usage(record)

    def sync(self) -> None:
        self.wal.sync()

    def usage_lines(self, bad: BadLine | None = None) -> Iterator[dict[str, Any]]:
        return self.wal.usage_lines(bad)

    def load_state(self, seen: Callable[[dict[str, Any]], None] | None = None) -> dict[str, KeyState]:
        """Replay the journal into the state of every idempotency key it names (`work.replay.replay`)."""
        return replay(self.wal.events(), self.files.files_exist, seen)

    # -- files (work.outputfiles) --

    def prepare(self) -> None:
        self.files.prepare()

    def write_file(self, name: str, data: bytes) -> str:
        return self.files.write_file(name, data)

    def thumbnail(self, rel: str, data: bytes) -> None:
        self.files.thumbnail(rel, data)

    def chain_name(self, job_id: str, request_index: int) -> str:
        return self.files.chain_name(job_id, request_index)

    def chain_path(self, job_id: str, request_index: int) -> Path:
        return self.files.chain_path(job_id, request_index)

    def save_chain(self, job_id: str, request_index: int, history: dict[str, Any]) -> None:
        self.files.save_chain(job_id, request_index, history)

    def load_chain(self, job_id: str, request_index: int) -> dict[str, Any] | None:
        return self.files.load_chain(job_id, request_index)

    def save_conversation(self, req: PlannedRequest, conversation: dict[str, Any]) -> None:
        self.files.save_conversation(req, conversation)

    def load_conversation(self, req: PlannedRequest) -> dict[str, Any] | None:
        return self.files.load_conversation(req)

    def write_results(self, rows: Iterable[dict[str, Any]], metadata_columns: list[str]) -> None:
        self.files.write_results(rows, metadata_columns)

    def read_results(self, bad: BadLine | None = None) -> list[dict[str, str]] | None:
        return self.files.read_results(bad)

    def write_run(self, info: Mapping[str, Any] | RunSummary) -> None:
        self.files.write_run(info)

    def read_run(self) -> RunSummary | None:
        """run.json through its model, or None when the location has none; `RunSummaryError` (one line
        naming the file and the field) for one the model refuses."""
        return read_summary(self.location.get(layout.RUN_JSON), f"{self.where}/{layout.RUN_JSON}")

    def settle_dead_run(self, now: str) -> RunSummary | None:
        """A run.json that still says `running` while no run holds the location is a run whose process died
        (`kill -9`, a lost machine, a plain worker's SIGTERM): say so in it, as `crashed` at `now` (ISO
        time), and return what it says now; None when there was nothing to correct. A reader that may
        write (`imagebatch report`, the next run) calls it; one that may not (`validate --out`) does not."""
        info = self.read_run()
        if info is None or info.state != "running" or self.in_use() is not None:
            return None
        why = "its process ended without recording its end (killed, or its machine lost); a rerun resumes it"
        info = info.changed(state="crashed", stopped=why, noticed_at=now)
        self.write_run(info)
        return info

    def write_top(self, name: str, data: bytes) -> None:
        self.files.write_top(name, data)
