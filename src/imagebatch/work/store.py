"""A run's record in its output location (a local folder, or an object store's prefix), as the run speaks
of it: the journal's events and outcomes, the usage ledger, each key's state replayed from them
(`work.replay`), the output files, chains and conversations, results.csv and run.json. Where and how the
bytes are kept, and who may write them, is the location's own business (`storage.backend.Backend`,
`backend`); the names are `storage.layout`'s, and README "The output folder" describes them.

A rerun reads the journal, not Prefect's database, so a copied output location resumes correctly.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from imagebatch.storage import layout
from imagebatch.storage.appendlog import read_jsonl
from imagebatch.storage.backend import Backend
from imagebatch.storage.bounded import BadLine
from imagebatch.storage.csvcells import read_csv, write_csv
from imagebatch.storage.kinds import open_location
from imagebatch.storage.location import OutputLockedError, atomic_file, json_object, write_atomic
from imagebatch.work.replay import KeyState, replay
from imagebatch.work.request_record import RESULT_COLUMNS, STATUSES, RequestRecord, Status, file_stem
from imagebatch.work.runsummary import RunSummary, read_summary
from imagebatch.work.stateindex import StateIndex
from imagebatch.work.thumbnails import keep_thumbnail

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
    """One output location's record. Safe to share between the threads of one run.

    `shard`: `I-of-N` for one shard of a sharded run (its own journal and usage file), else None.
    `clock`: the wall clock an object store's lease is timed by (tests inject one)."""

    def __init__(
        self, root: Path | str, shard: str | None = None, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.backend: Backend = open_location(root, shard, clock=clock)
        """Where the bytes are, and who holds the place (`hold`, `shard_hold`, `in_use`, `sync`)."""
        self.shard = shard
        self.where = self.backend.url
        """The location as messages name it: a folder's path, or `s3://bucket/prefix` (no credential)."""

    # -- the journal, the usage ledger and their replay --

    def journal(self, event: str, *, sync: bool = True, **fields: Any) -> None:
        """Append an event to the write-ahead journal and make it durable before returning.

        `sync=False` for a line a synced one will cover before it matters: the next sync of the journal
        (any thread's) covers every line written before it, and `backend.sync` at the end of a run covers
        the rest. A success's `attempt_finished` is followed by its synced `answered`, and its `outcome`
        only repeats what `answered` and the files already say; each fsync saved is 1-4 ms of a request
        thread's time between answer and next send (bench/README.md "Throughput")."""
        self.backend.append(layout.JOURNAL, {"event": event, **fields}, sync=sync)

    def record_outcome(self, record: RequestRecord) -> None:
        """Journal a request's outcome; a success's needs no sync of its own (its synced `answered` and
        its files already make it done on replay, see `work.replay`)."""
        self.journal("outcome", sync=record.status != "succeeded", **asdict(record))

    def append_usage(self, record: dict[str, Any]) -> None:
        """One usage line (an HTTP attempt), not synced: the next synced journal line covers it."""
        self.backend.append(layout.USAGE_LEDGER, record, sync=False)

    def usage_lines(self, bad: BadLine | None = None) -> Iterator[dict[str, Any]]:
        """The usage ledger: one line per HTTP attempt, every run into the location. With `bad`, told of
        each line skipped as bad (`storage.bounded`); without, a line over the bound is refused."""
        return self.backend.records(layout.USAGE_LEDGER, bad)

    def load_state(
        self, seen: Callable[[dict[str, Any]], None] | None = None, *, spool: Path | None = None
    ) -> StateIndex[KeyState]:
        """Replay the journal into the state of every idempotency key it names (`work.replay.replay`): a
        read-only mapping, on disk past a few thousand keys (`work.stateindex`), its file in `spool`.

        `spool` is for a run, which holds the location and has its room (`backend.spool_folder`); None,
        for a command that only reads the location (export, report, review, validate --out), puts the
        file in the machine's temporary folder: such a command writes nothing into an output folder,
        not even a name made and unlinked (which would change the folder's modification time)."""

        def files_exist(record: RequestRecord, settled: bool) -> bool:
            return self.backend.files_exist(list(record.paths), settled)

        return replay(self.backend.records(layout.JOURNAL), files_exist, seen, spool)

    def journal_events(self) -> Iterator[dict[str, Any]]:
        """The journal's lines in order, as they are read (no state kept): for a reader that needs only
        some of them (export's look-up of the requests an earlier key was of)."""
        return self.backend.records(layout.JOURNAL)

    # -- files --

    def write_file(self, name: str, data: bytes) -> str:
        """Write an output file under images/ whole; return its name relative to the location (a folder
        refuses a path that a link leads out of OUT)."""
        with self.backend.watch.writing():
            self.backend.put(f"{layout.IMAGES_DIR}/{name}", data)
        return f"{layout.IMAGES_DIR}/{name}"

    def thumbnail(self, rel: str, data: bytes) -> None:
        """The report's thumbnail of the image `rel`, from its bytes still in memory (best effort)."""
        keep_thumbnail(self.backend, rel, data)

    def chain_name(self, job_id: str, request_index: int) -> str:
        """A chain's history, named relative to the output location."""
        return f"{layout.CHAINS_DIR}/{job_id}/{request_index}.json"

    def save_chain(self, job_id: str, request_index: int, history: dict[str, Any]) -> None:
        with self.backend.watch.writing():
            self.backend.put(self.chain_name(job_id, request_index), json.dumps(history).encode())

    def load_chain(self, job_id: str, request_index: int) -> dict[str, Any] | None:
        data = self.backend.get(self.chain_name(job_id, request_index))
        return None if data is None else json.loads(data)

    def save_conversation(self, req: PlannedRequest, conversation: dict[str, Any]) -> None:
        """Keep the conversation behind one native answer (`work.conversation`), not synced: one more sync
        per request would cost a request thread 1-4 ms, and a conversation a power cut loses only makes
        that image's later `--edit` a new sample (counted as "no kept history"), never a wrong request."""
        stem = file_stem(req, bool(req.job.turns))
        self.backend.keep_conversation(stem, req.idempotency_key, conversation)

    def load_conversation(self, req: PlannedRequest) -> dict[str, Any] | None:
        """The conversation kept for `req`'s answer by an earlier run, or None (never kept, or unreadable)."""
        data = self.backend.kept_conversation(file_stem(req, bool(req.job.turns)), req.idempotency_key)
        loaded = None if data is None else json_object(data)
        return loaded if loaded is not None and loaded.get("key") == req.idempotency_key else None

    def write_results(self, rows: Iterable[dict[str, Any]], metadata_columns: list[str]) -> None:
        """Write results.csv whole, row by row (no copy of the whole table in memory); cells that a
        spreadsheet would run as a formula are neutralised (`csv_cell`; `read_csv` reads them back)."""
        columns = list(RESULT_COLUMNS) + [c for c in metadata_columns if c not in RESULT_COLUMNS]
        with self.backend.replacing(layout.RESULTS_CSV) as fh:
            _write_csv_bytes(fh, columns, rows)

    def read_results(self, bad: BadLine | None = None) -> list[dict[str, str]] | None:
        """results.csv's rows, every cell as it was before the writer neutralised formulas (`csvcells`);
        None when the location has none (no run has ended there). `bad`: as `csvcells.read_csv`'s."""
        data = self.backend.get(layout.RESULTS_CSV)
        if data is None:
            return None
        return list(read_csv(io.StringIO(data.decode("utf-8"), newline=""), bad=bad))

    # -- run.json --

    def write_run(self, info: Mapping[str, Any] | RunSummary) -> None:
        """Write run.json, built as the model (`work.runsummary`) from what the run says of itself."""
        summary = info if isinstance(info, RunSummary) else RunSummary.of(info)
        self.backend.put(layout.RUN_JSON, summary.record())

    def read_run(self) -> RunSummary | None:
        """run.json through its model, or None when the location has none; `RunSummaryError` (one line
        naming the file and the field) for one the model refuses."""
        return read_summary(self.backend.get(layout.RUN_JSON), f"{self.where}/{layout.RUN_JSON}")

    def settle_dead_run(self, now: str) -> RunSummary | None:
        """A run.json that still says `running` while no run holds the location is a run whose process died
        (`kill -9`, a lost machine, a plain worker's SIGTERM): say so in it, as `crashed` at `now` (ISO
        time), and return what it says now; None when there was nothing to correct. A reader that may
        write (`imagebatch report`, the next run) calls it; one that may not (`validate --out`) does not."""
        info = self.read_run()
        if info is None or info.state != "running" or self.backend.in_use() is not None:
            return None
        why = "its process ended without recording its end (killed, or its machine lost); a rerun resumes it"
        info = info.changed(state="crashed", stopped=why, noticed_at=now)
        self.write_run(info)
        return info


def _write_csv_bytes(fh: BinaryIO, columns: list[str], rows: Iterable[dict[str, Any]]) -> None:
    """`write_csv` into a binary file, UTF-8, leaving it open (its owner syncs and closes it)."""
    text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
    write_csv(text, columns, rows)
    text.flush()
    text.detach()
