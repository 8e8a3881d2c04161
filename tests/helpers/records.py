"""Journal events and records for tests of the output store: a key's attempts, answers and outcomes written
as a run writes them."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from imagebatch.work.request_record import RequestRecord
from imagebatch.work.store import OutputStore

KEY = "ib1-0123456789abcdef0123456789abcdef"
OTHER = "ib1-fedcba9876543210fedcba9876543210"


def record(status: str = "succeeded", key: str = KEY, **fields: Any) -> RequestRecord:
    return RequestRecord(
        job_id="mug",
        request_index=0,
        turn_index=0,
        status=status,  # type: ignore[arg-type]
        model="native-image-2.1",
        route="native",
        idempotency_key=key,
        **fields,
    )


def leftovers(folder: Path) -> list[str]:
    """The temporary files an atomic write left in `folder` (none, when it did its job)."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def started(store: OutputStore, key: str = KEY, attempt: int = 1) -> None:
    store.journal("attempt_started", idempotency_key=key, attempt=attempt)


def finished(store: OutputStore, status: int | None, outcome: str, key: str = KEY, attempt: int = 1) -> None:
    store.journal("attempt_finished", idempotency_key=key, attempt=attempt, status=status, outcome=outcome)


def answered(store: OutputStore, rec: RequestRecord) -> None:
    store.journal("answered", **asdict(rec))
