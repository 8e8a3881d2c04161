"""What one request's outcome is, as a results row: built from an answer, an error, or an earlier run.

The statuses are `request_record.STATUSES` (the README says what each means to a rerun); this module
decides which one a request gets, and which errors stop the whole run.
"""

from __future__ import annotations

import dataclasses
import errno
import json
from pathlib import Path
from typing import Any

from imagebatch.gateway import ImageResult, NoImageResult, TextResult
from imagebatch.gateway.errors import (
    APIStatusError,
    AuthenticationError,
    GatewayError,
    InsufficientFundsError,
    NotFoundError,
    ServiceUnreachableError,
)
from imagebatch.gateway.imagefile import EXTENSIONS
from imagebatch.manifest import PlannedRequest
from imagebatch.storage.layout import IMAGES_DIR, UNKNOWN_HINT
from imagebatch.work.store import KeyState, RequestRecord, file_stem

Result = ImageResult | NoImageResult | TextResult


def record(req: PlannedRequest, status: str, **fields: Any) -> RequestRecord:
    """A results row for `req` with `status` and the given fields."""
    return RequestRecord(
        job_id=req.job_id,
        request_index=req.request_index,
        turn_index=req.turn_index,
        status=status,  # type: ignore[arg-type]
        model=req.model,
        route=req.route.value,  # the enum's own string: str() makes a copy per record
        idempotency_key=req.idempotency_key,
        variant=req.variant,
        **fields,
    )


def plan_files(
    req: PlannedRequest, result: Result, chain: bool
) -> tuple[RequestRecord, list[tuple[str, bytes]]]:
    """The record of a successful answer and the files (name under images/, bytes) it needs written."""
    stem = file_stem(req, chain)
    common = {"attempts": result.attempts, "request_id": result.request_id}
    if isinstance(result, TextResult):
        files = [
            (f"{stem}.txt", result.text.encode()),
            (f"{stem}.json", json.dumps(result.raw, indent=2).encode()),
        ]
        return record(req, "succeeded", paths=[f"{IMAGES_DIR}/{n}" for n, _ in files], **common), files
    if isinstance(result, NoImageResult):
        detail = {
            "finish_reason": result.finish_reason,
            "text": result.text,
            "prompt_feedback": result.prompt_feedback,
        }
        files = [(f"{stem}.no_image.json", json.dumps(detail, indent=2).encode())]
        why = f"no image (finishReason {result.finish_reason})" + (f": {result.text}" if result.text else "")
        paths = [f"{IMAGES_DIR}/{files[0][0]}"]
        done = record(req, "no_image", paths=paths, finish_reason=result.finish_reason, error=why, **common)
        return done, files
    files = [
        (f"{stem}{f'-{k}' if k else ''}{EXTENSIONS[image.mime_type]}", image.data)
        for k, image in enumerate(result.images)
    ]
    first = result.images[0]
    done = record(
        req,
        "succeeded",
        paths=[f"{IMAGES_DIR}/{n}" for n, _ in files],
        images=len(files),
        width=first.width,
        height=first.height,
        mime_type=first.mime_type,
        finish_reason=result.finish_reason,
        **common,
    )
    return done, files


def halt_reason(exc: GatewayError, key_source: str) -> str | None:
    """Why every later request would fail the same way (so the run stops dispatching), or None."""
    if isinstance(exc, AuthenticationError):
        return f"the service refused the API key (HTTP 401): set {key_source} to a valid key"
    if isinstance(exc, InsufficientFundsError):
        return "the account has insufficient funds (HTTP 402): top it up, then rerun"
    if isinstance(exc, NotFoundError) and exc.code != "model_not_found":
        return f"the service answered 404 ({exc.message}): check the base URL (the service root)"
    if isinstance(exc, ServiceUnreachableError):
        return f"{exc.message}: check the base URL and the network"
    return None


def failure(req: PlannedRequest, exc: GatewayError) -> RequestRecord:
    """The record of a request that raised: `unknown` when it may have been billed, else `failed`."""
    request_id = getattr(exc, "request_id", None)
    status = exc.status_code if isinstance(exc, APIStatusError) else None
    error = str(exc) if isinstance(exc, APIStatusError) else exc.message
    if exc.may_have_been_billed:
        error = f"{error}; {UNKNOWN_HINT}"
        return record(
            req, "unknown", attempts=exc.attempts, request_id=request_id, error=error, http_status=status
        )
    return record(
        req, "failed", attempts=exc.attempts, request_id=request_id, error=error, http_status=status
    )


def carried(req: PlannedRequest, state: KeyState | None) -> RequestRecord:
    """The record of a request this run does not send: succeeded before (skipped), no_image, or unknown;
    or a variant that only a `--redo` run sends (`context.decide`), as it stands."""
    previous = state.outcome if state else None
    if previous is not None and previous.status == "succeeded":
        return dataclasses.replace(previous, status="skipped")
    if previous is not None:
        return previous
    if state is not None and state.status is None:  # a variant whose files are gone, left to a redo
        return not_attempted(req, f"variant {req.variant} is made again only by a run with --redo rejected")
    attempts = state.attempts if state else 0
    why = f"sent, but no answer was recorded; {UNKNOWN_HINT}"
    return record(req, "unknown", attempts=attempts, error=why)


def not_attempted(req: PlannedRequest, why: str) -> RequestRecord:
    return record(req, "not_attempted", error=why)


def unsaved(req: PlannedRequest, result: Result, exc: OSError) -> RequestRecord:
    """An answer (billed) whose files could not be written: `unknown`, never resent on its own."""
    return record(
        req,
        "unknown",
        attempts=result.attempts,
        request_id=result.request_id,
        error=f"answered (and billed) but could not be saved: {exc.strerror or exc}; {UNKNOWN_HINT}",
    )


def not_journaled(req: PlannedRequest, attempt: int, why: str) -> RequestRecord:
    """An attempt that could not be journaled was not sent: the request is `not_attempted` if it was its
    first, else `unknown` (an earlier attempt was sent and may have been billed)."""
    if attempt == 1:
        return not_attempted(req, why)
    return record(req, "unknown", attempts=attempt - 1, error=f"{why}; {UNKNOWN_HINT}")


def storage_message(out: Path | str, exc: OSError) -> str:
    """One line for a failed write to the output folder, saying what to do."""
    if exc.errno == errno.ENOSPC:
        return f"disk full at {out}: free space, then rerun"
    return f"cannot write to {out}: {exc.strerror or exc}: fix it, then rerun"
