"""One request's record: its status, the results.csv row it becomes (`RESULT_COLUMNS`), and the stem of
its files' names. Small by design: a run holds one per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from imagebatch.manifest.plan import key_digits

if TYPE_CHECKING:
    from imagebatch.manifest import PlannedRequest

Status = Literal["succeeded", "no_image", "failed", "unknown", "not_attempted", "skipped"]
STATUSES: tuple[Status, ...] = ("succeeded", "no_image", "failed", "unknown", "not_attempted", "skipped")

RESULT_COLUMNS = (
    "job_id",
    "request_index",
    "turn_index",
    "variant",
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


def file_stem(req: PlannedRequest, chain: bool) -> str:
    """`<job>/<request>[-t<turn>][-v<variant>]-<key>`: one folder per job (ids are unique, so names cannot
    collide), and the key in the name, so an edited row's image never overwrites the one its old key
    points to; `-v<n>` for variant n >= 2 (a redo), whose key differs too."""
    turn = f"-t{req.turn_index}" if chain else ""
    variant = f"-v{req.variant}" if req.variant > 1 else ""
    return f"{req.job_id}/{req.request_index}{turn}{variant}-{key_digits(req.idempotency_key)[:12]}"


@dataclass(slots=True)
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
    http_status: int | None = None
    """The HTTP status of the answer that made the request `failed` or `unknown` (None: no such answer)."""
    variant: int = 1
    """1 for a request's first sample, n for the n-th (`--redo rejected`); a record without one is 1. Last,
    so that records built by position keep their meaning (results.csv's column order is `RESULT_COLUMNS`)."""

    def to_row(self) -> dict[str, Any]:
        row = {k: getattr(self, k) for k in RESULT_COLUMNS}
        row["paths"] = ";".join(self.paths)
        return {k: ("" if v is None else v) for k, v in row.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
