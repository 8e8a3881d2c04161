"""The client's attempt observer (`AttemptJournal`): each attempt journaled before it is sent, then what
came back and one usage line. An attempt that cannot be journaled is not sent (`NotJournaledError`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from imagebatch.gateway import AttemptEvent, AttemptStarted
from imagebatch.work.store import OutputStore

if TYPE_CHECKING:
    from imagebatch.manifest import PlannedRequest
    from imagebatch.work.context import StartedKeys


class NotJournaledError(OSError):
    """An attempt could not be journaled before it was sent, so it was not sent."""

    def __init__(self, attempt: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.attempt = attempt


class AttemptJournal:
    """The client's attempt observer for one request: journal (synced) before each attempt is sent, then
    what came back, and one usage line per attempt. Attempts are numbered across runs into the folder
    (`earlier`: how many the journal already holds for this key), as results.csv counts them."""

    def __init__(
        self, store: OutputStore, req: PlannedRequest, started_keys: StartedKeys, earlier: int = 0
    ) -> None:
        self.store = store
        self.started_keys = started_keys
        self.earlier = earlier
        self.ids = {
            "idempotency_key": req.idempotency_key,
            "job_id": req.job_id,
            "request_index": req.request_index,
            "turn_index": req.turn_index,
            "variant": req.variant,
        }

    def __call__(self, event: AttemptEvent) -> None:
        common: dict[str, Any] = {
            **self.ids,
            "route": str(event.route),
            "model": event.model,
            "attempt": self.earlier + event.attempt,
            "started_at": event.started_at.isoformat(),
        }
        if isinstance(event, AttemptStarted):
            try:
                self.store.journal("attempt_started", **common)
            except OSError as exc:  # not journaled: must not be sent (raised out of the client's loop)
                raise NotJournaledError(event.attempt, exc) from exc
            self.started_keys.add(event.idempotency_key)
            return
        error_code = event.error_code or (None if event.outcome == "ok" else event.outcome)
        finished = {
            "duration_s": round(event.duration, 4),
            "outcome": event.outcome,
            "error_code": error_code,
            "request_id": event.request_id,
            "images": event.images,
            "retry_in": event.retry_in,
        }
        try:
            # An answer (`ok`) is journaled next, synced, by `send_and_record`: that fsync covers this line.
            ok = event.outcome == "ok"
            self.store.journal("attempt_finished", sync=not ok, **common, status=event.status, **finished)
            self.store.append_usage({**common, **finished, "http_status": event.status, "usage": event.usage})
        except OSError:
            pass  # noted by the store (dispatch stops); the answer itself must still reach the caller
