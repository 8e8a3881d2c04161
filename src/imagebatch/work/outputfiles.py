"""The files of an output location other than its journal: images and texts, chains' histories, the
conversations behind native answers, results.csv and run.json. Each is written whole and atomically (a
reader sees the old file or the new one), in a folder or as one object in an object store.
"""

from __future__ import annotations

import io
import json
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from imagebatch.storage import layout
from imagebatch.storage.appendlog import AppendLog
from imagebatch.storage.bounded import BadLine, read_record
from imagebatch.storage.csvcells import read_csv, write_csv
from imagebatch.storage.location import Location, atomic_file, json_object, write_atomic
from imagebatch.work.holds import NO_FOLDER, Holds
from imagebatch.work.request_record import RESULT_COLUMNS, RequestRecord, file_stem
from imagebatch.work.runsummary import RunSummary
from imagebatch.work.thumbnails import make_thumbnail, put_thumbnail

if TYPE_CHECKING:
    from imagebatch.manifest import PlannedRequest


class OutputFiles:
    """The files of one output location; `holds.folder` is None for an object store."""

    def __init__(self, holds: Holds, log: AppendLog, shard: str | None) -> None:
        self.holds, self.log = holds, log
        self.location: Location = holds.location
        self.folder = holds.folder
        base = self.folder or NO_FOLDER
        self.images_dir = base / layout.IMAGES_DIR
        self.chains_dir = base / layout.CHAINS_DIR
        self.results_path = base / layout.RESULTS_CSV
        self.run_path = base / layout.RUN_JSON
        self.conversations_path = base / layout.jsonl(layout.CONVERSATIONS, shard)
        self._conversations: dict[str, tuple[Path, int, int]] = {}
        """Where each key's kept conversation is (`load_conversation`), as far as read."""
        self._conversations_read: dict[Path, int] = {}
        self._lock = threading.Lock()

    def prepare(self) -> None:
        if self.folder is None:
            return  # an object store has no folders to make
        self.images_dir.mkdir(parents=True, exist_ok=True)
        self.chains_dir.mkdir(parents=True, exist_ok=True)

    def files_exist(self, record: RequestRecord, settled: bool) -> bool:
        """Whether a record's files are all there. In an object store a settled outcome is trusted (it was
        journaled after its files were written): a rerun reads no image and makes no request per image;
        only an answer whose outcome was never journaled has its files looked up (HEAD)."""
        if self.folder is None:
            return settled or all(self.location.exists(p) for p in record.paths)
        return all((self.folder / p).is_file() for p in record.paths)

    def write_file(self, name: str, data: bytes) -> str:
        """Write an output file under images/ atomically; return its path relative to the output folder.
        Through the location for both kinds: a folder's refuses a path that a link leads out of OUT."""
        with self.holds.watch.writing():
            self.location.put(f"{layout.IMAGES_DIR}/{name}", data)
        return f"{layout.IMAGES_DIR}/{name}"

    def thumbnail(self, rel: str, data: bytes) -> None:
        """The report's thumbnail of the image `rel`, from its bytes still in memory (best effort)."""
        if self.folder is None:
            put_thumbnail(self.holds.objects(), rel, data)
            return
        make_thumbnail(self.folder, rel, data)

    def chain_name(self, job_id: str, request_index: int) -> str:
        """A chain's history, named relative to the output location."""
        return f"{layout.CHAINS_DIR}/{job_id}/{request_index}.json"

    def chain_path(self, job_id: str, request_index: int) -> Path:
        return self.chains_dir / job_id / f"{request_index}.json"

    def save_chain(self, job_id: str, request_index: int, history: dict[str, Any]) -> None:
        with self.holds.watch.writing():
            if self.folder is None:
                self.location.put(self.chain_name(job_id, request_index), json.dumps(history).encode())
                return
            write_atomic(self.chain_path(job_id, request_index), json.dumps(history).encode())

    def load_chain(self, job_id: str, request_index: int) -> dict[str, Any] | None:
        if self.folder is None:
            data = self.location.get(self.chain_name(job_id, request_index))
            return None if data is None else json.loads(data)
        data = read_record(self.chain_path(job_id, request_index))
        return None if data is None else json.loads(data)

    def save_conversation(self, req: PlannedRequest, conversation: dict[str, Any]) -> None:
        """Keep the conversation behind one native answer (`work.conversation`): in a folder a line of
        `conversations.jsonl`, appended and not synced; in an object store an object named after the
        answer's files (`layout.conversation`).

        Appended, not a file each: a file costs a request thread about 0.4 ms of CPU (a temporary file and
        a rename; bench/README.md), a tenth of a request's whole cost in a run; an append, microseconds.
        Not synced: one more fsync per request would cost a request thread 1-4 ms, and a line a power cut
        loses only makes that image's later `--edit` a new sample (counted as "no kept history"), never a
        wrong request."""
        record = {"key": req.idempotency_key, **conversation}
        if self.folder is None:
            name = layout.conversation(file_stem(req, bool(req.job.turns)))
            with self.holds.watch.writing():
                self.location.put(name, json.dumps(record, separators=(",", ":")).encode())
            return
        self.log.append(self.conversations_path, record, sync=False)

    def load_conversation(self, req: PlannedRequest) -> dict[str, Any] | None:
        """The conversation kept for `req`'s answer by an earlier run, or None (never kept, or unreadable).

        In a folder, the conversation files are read once into an index of where each key's line is (its
        offset: the lines stay on disk), and past their last indexed line only for a key not found."""
        if self.folder is None:
            data = self.location.get(layout.conversation(file_stem(req, bool(req.job.turns))))
        else:
            with self._lock:
                where = self._conversations.get(req.idempotency_key)
                if where is None:  # not read yet: read what was appended since
                    _index_conversations(self.folder, self._conversations, self._conversations_read)
                    where = self._conversations.get(req.idempotency_key)
            data = _read_at(*where) if where is not None else None
        loaded = None if data is None else json_object(data)
        return loaded if loaded is not None and loaded.get("key") == req.idempotency_key else None

    def write_results(self, rows: Iterable[dict[str, Any]], metadata_columns: list[str]) -> None:
        """Write results.csv atomically, row by row (no copy of the whole table in memory); cells that a
        spreadsheet would run as a formula are neutralised (`csv_cell`; `read_csv` reads them back)."""
        columns = list(RESULT_COLUMNS) + [c for c in metadata_columns if c not in RESULT_COLUMNS]
        if self.folder is None:  # row by row into a temporary file, then one multipart upload
            with tempfile.TemporaryFile(prefix="imagebatch-results-") as spool:
                _write_csv_bytes(spool, columns, rows)
                spool.seek(0)
                self.holds.objects().put_stream(layout.RESULTS_CSV, spool)
            return
        with atomic_file(self.results_path) as fh:
            _write_csv_bytes(fh, columns, rows)

    def read_results(self, bad: BadLine | None = None) -> list[dict[str, str]] | None:
        """results.csv's rows, every cell as it was before the writer neutralised formulas (`csvcells`);
        None when the location has none (no run has ended there). `bad`: as `csvcells.read_csv`'s."""
        data = self.location.get(layout.RESULTS_CSV)
        if data is None:
            return None
        return list(read_csv(io.StringIO(data.decode("utf-8"), newline=""), bad=bad))

    def write_run(self, info: Mapping[str, Any] | RunSummary) -> None:
        """Write run.json, built as the model (`work.runsummary`) from what the run says of itself."""
        summary = info if isinstance(info, RunSummary) else RunSummary.of(info)
        self.write_top(layout.RUN_JSON, summary.record())

    def write_top(self, name: str, data: bytes) -> None:
        """Write a whole file at the top of the location (run.json, usage-summary.csv): whole, and in a
        folder never through a link out of it (`LocalFolder.put`)."""
        self.location.put(name, data)


_KEY_PREFIX = b'{"key":"'


def _write_csv_bytes(fh: BinaryIO, columns: list[str], rows: Iterable[dict[str, Any]]) -> None:
    """`write_csv` into a binary file, UTF-8, leaving it open (its owner syncs and closes it)."""
    text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
    write_csv(text, columns, rows)
    text.flush()
    text.detach()


def _index_conversations(root: Path, index: dict[str, tuple[Path, int, int]], read: dict[Path, int]) -> None:
    """Add to `index` the (file, offset, length) of each key's last conversation line in a folder (the
    folder's file, then the shards'), reading each file from where `read` says the last call stopped; a
    line not yet ended (being written, or cut short by a crash) is left for later."""
    paths = [
        root / layout.jsonl(layout.CONVERSATIONS),
        *sorted(root.glob(layout.shard_jsonl(layout.CONVERSATIONS))),
    ]
    for path in paths:
        if not path.is_file():
            continue
        with path.open("rb") as fh:
            offset = read.get(path, 0)
            fh.seek(offset)
            for line in fh:
                if not line.endswith(b"\n"):
                    break
                end = line.find(b'"', len(_KEY_PREFIX))
                if line.startswith(_KEY_PREFIX) and end > 0:
                    index[line[len(_KEY_PREFIX) : end].decode("ascii", "replace")] = (path, offset, len(line))
                offset += len(line)
            read[path] = offset


def _read_at(path: Path, offset: int, length: int) -> bytes | None:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read(length)
    except OSError:
        return None
