"""The output directory: the source of truth for what has been done.

Layout::

    images/          every image and text output, written atomically (temporary file, then rename)
    chains/          the edit history of each chain, as the service returned it, after each turn
    journal.jsonl    write-ahead: an attempt is recorded (and fsynced) before it is sent; outcomes follow
    usage.jsonl      one line per HTTP attempt, appended as it finishes
    results.csv      one row per request, rewritten atomically at the end of each run
    run.json         what the last run was asked and what it did

A rerun reads the journal, not Prefect's database, so a copied output directory resumes correctly. A line
cut short by a crash (kill -9 in the middle of a write) is ignored when the journal is read.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["succeeded", "no_image", "failed", "unknown", "not_attempted", "skipped"]
STATUSES: tuple[Status, ...] = ("succeeded", "no_image", "failed", "unknown", "not_attempted", "skipped")
# Outcomes that are final: a rerun does not send them again unless forced.
DONE_STATUSES = frozenset({"succeeded", "no_image"})

RESULT_COLUMNS = (
    "job_id",
    "request_index",
    "turn_index",
    "status",
    "paths",
    "images",
    "width",
    "height",
    "mime_type",
    "model",
    "route",
    "idempotency_key",
    "attempts",
    "finish_reason",
    "error",
    "request_id",
)


@dataclass
class RequestRecord:
    """The outcome of one request: a results.csv row without the manifest's metadata. Small by design."""

    job_id: str
    request_index: int
    turn_index: int
    status: Status
    model: str
    route: str
    idempotency_key: str
    paths: list[str] = field(default_factory=list)
    images: int = 0
    width: int | None = None
    height: int | None = None
    mime_type: str | None = None
    attempts: int = 0
    finish_reason: str | None = None
    error: str | None = None
    request_id: str | None = None
    text: str | None = None

    def to_row(self) -> dict[str, Any]:
        row = {k: getattr(self, k) for k in RESULT_COLUMNS}
        row["paths"] = ";".join(self.paths)
        return {k: ("" if v is None else v) for k, v in row.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects of a JSON Lines file, skipping a final line cut short by a crash."""
    if not path.exists():
        return
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                return  # torn last write
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
                yield obj


@dataclass
class KeyState:
    """What the journal says about one idempotency key."""

    outcome: RequestRecord | None = None
    in_flight: bool = False
    """An attempt was started and no answer was recorded: it may have been generated and billed."""
    billed_without_record: bool = False
    """A success answer arrived but its outcome was never recorded (crash while saving)."""
    attempts: int = 0

    @property
    def status(self) -> Status | None:
        """The status a rerun should take as the starting point (None: never sent)."""
        if self.in_flight or self.billed_without_record:
            return "unknown"
        if self.outcome is not None:
            return self.outcome.status
        return "failed" if self.attempts else None


class OutputStore:
    """Reads and writes one output directory. Safe to share between the threads of one run."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.images_dir = self.root / "images"
        self.chains_dir = self.root / "chains"
        self.journal_path = self.root / "journal.jsonl"
        self.usage_path = self.root / "usage.jsonl"
        self.results_path = self.root / "results.csv"
        self.run_path = self.root / "run.json"
        self._lock = threading.Lock()
        self._tail_checked: set[Path] = set()

    def prepare(self) -> None:
        self.images_dir.mkdir(parents=True, exist_ok=True)
        self.chains_dir.mkdir(parents=True, exist_ok=True)

    # -- journal and usage --

    def _append(self, path: Path, record: dict[str, Any], *, sync: bool) -> None:
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock, path.open("ab") as fh:
            if path not in self._tail_checked:
                # A line torn by a crash has no newline: end it, or this record would be glued onto it
                # and lost with it when the file is read.
                self._tail_checked.add(path)
                if fh.tell() and _last_byte(path) != b"\n":
                    line = b"\n" + line
            fh.write(line)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())

    def journal(self, event: str, **fields: Any) -> None:
        """Append an event to the write-ahead journal and make it durable before returning."""
        self._append(self.journal_path, {"event": event, **fields}, sync=True)

    def append_usage(self, record: dict[str, Any]) -> None:
        self._append(self.usage_path, record, sync=False)

    def record_outcome(self, record: RequestRecord) -> None:
        self.journal("outcome", **asdict(record))

    def load_state(self) -> dict[str, KeyState]:
        """Replay the journal into the state of every idempotency key it names."""
        states: dict[str, KeyState] = {}
        for ev in read_jsonl(self.journal_path):
            key = ev.get("idempotency_key")
            if not isinstance(key, str):
                continue
            st = states.setdefault(key, KeyState())
            kind = ev.get("event")
            if kind == "attempt_started":
                st.in_flight = True
                st.billed_without_record = False
                st.attempts += 1
            elif kind == "attempt_finished":
                st.in_flight = False
                if ev.get("status") is None and ev.get("outcome") == "no_answer":
                    st.in_flight = True  # no answer: may have been generated
                elif ev.get("outcome") == "ok":
                    st.billed_without_record = True
            elif kind == "outcome":
                st.outcome = RequestRecord.from_json(ev)
                st.in_flight = False
                st.billed_without_record = False
        return states

    # -- files --

    def write_file(self, name: str, data: bytes) -> str:
        """Write an output file under images/ atomically; return its path relative to the output folder."""
        path = self.images_dir / name
        write_atomic(path, data)
        return path.relative_to(self.root).as_posix()

    def chain_path(self, job_id: str, request_index: int) -> Path:
        return self.chains_dir / f"{job_id}_{request_index}.json"

    def save_chain(self, job_id: str, request_index: int, history: dict[str, Any]) -> None:
        write_atomic(self.chain_path(job_id, request_index), json.dumps(history).encode())

    def load_chain(self, job_id: str, request_index: int) -> dict[str, Any] | None:
        path = self.chain_path(job_id, request_index)
        if not path.exists():
            return None
        return json.loads(path.read_bytes())

    def write_results(self, rows: Iterable[dict[str, Any]], metadata_columns: list[str]) -> None:
        columns = list(RESULT_COLUMNS) + [c for c in metadata_columns if c not in RESULT_COLUMNS]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
        write_atomic(self.results_path, buf.getvalue().encode())

    def write_run(self, info: dict[str, Any]) -> None:
        write_atomic(self.run_path, (json.dumps(info, indent=2, default=str) + "\n").encode())
