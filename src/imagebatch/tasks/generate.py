"""One unit of work: send the request(s) of one planned job request, save what came back, record the outcome.

A unit is one request, or for an edit chain the ordered turns of one request (each turn is its own billed
request with its own key and results row). The order of writes is what makes a crash at any moment safe:

1. `attempt_started` is journaled (and synced) before each HTTP attempt, `attempt_finished` after it;
2. a success is journaled as `answered`, naming the files it will write, before any file is written;
3. the files are written atomically (and a chain's history saved);
4. the `outcome` is journaled.

A rerun that finds `answered` with all its files on disk takes it as done; anything sent without a
settled answer is `unknown` and is not sent again unless the user asks. Nothing here returns image bytes.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from imagebatch.gateway.client import (
    AttemptEvent,
    AttemptFinished,
    AttemptStarted,
    GatewayClient,
    ImageResult,
    ImageUpload,
    NoImageResult,
    TextResult,
)
from imagebatch.gateway.constants import (
    DEFAULT_ASPECT_RATIO,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_IMAGES_API_SIZE,
    DEFAULT_MAX_TOKENS,
    Route,
)
from imagebatch.gateway.errors import (
    APIStatusError,
    AuthenticationError,
    GatewayError,
    InsufficientFundsError,
    NotFoundError,
    ServiceUnreachableError,
)
from imagebatch.gateway.imagefile import EXTENSIONS, sniff_mime

from .manifest import Job, PlannedRequest
from .store import KeyState, OutputStore, RequestRecord

UNKNOWN_HINT = (
    "check the service's usage history for this key, then rerun with --retry-unknown if it was not made"
)
Decision = Literal["send", "skip", "carry"]
Result = ImageResult | NoImageResult | TextResult

logger = logging.getLogger("imagebatch.run")


@dataclass
class Unit:
    """The requests one task sends: one, or the turns of one chain in order."""

    index: int
    """Position in the run's list of units (results are kept in this order)."""
    job: Job
    requests: list[PlannedRequest]

    @property
    def name(self) -> str:
        return f"{self.job.id}#{self.requests[0].request_index}"

    @property
    def is_chain(self) -> bool:
        return bool(self.job.turns)


class RunContext:
    """What every task of one run shares. A plain class, so Prefect does not walk it as task input."""

    def __init__(
        self,
        client: GatewayClient,
        store: OutputStore,
        states: dict[str, KeyState],
        *,
        force: bool = False,
        retry_unknown: bool = False,
    ) -> None:
        self.client = client
        self.store = store
        self.states = states
        self.force = force
        self.retry_unknown = retry_unknown
        self.halt = threading.Event()
        self.halt_reason: str | None = None
        self.results: dict[int, list[RequestRecord]] = {}
        """Records of each finished unit, by unit index (tasks return nothing: Prefect keeps results)."""
        self.started_keys: set[str] = set()
        """Keys with an attempt started in this run."""

    def stop_dispatch(self, reason: str) -> None:
        if not self.halt.is_set():
            self.halt_reason = reason
            self.halt.set()

    def decision(self, key: str) -> Decision:
        """`send` it, `skip` it (succeeded before), or `carry` its last status (no_image, unknown)."""
        if self.force:
            return "send"
        state = self.states.get(key)
        status = state.status if state else None
        if status == "succeeded":
            return "skip"
        if status == "no_image" or (status == "unknown" and not self.retry_unknown):
            return "carry"
        return "send"


# --- request bodies ------------------------------------------------------------------------------------


def _image_part(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {"inlineData": {"mimeType": sniff_mime(data), "data": base64.b64encode(data).decode()}}


def user_content(prompt: str, reference_images: Sequence[Path]) -> dict[str, Any]:
    """A native user turn: the text first, then each reference image as its own part."""
    return {"role": "user", "parts": [{"text": prompt}, *(_image_part(p) for p in reference_images)]}


def _image_options(job: Job) -> tuple[str, str]:
    return job.image_size or DEFAULT_IMAGE_SIZE, job.aspect_ratio or DEFAULT_ASPECT_RATIO


def _upload(path: Path) -> ImageUpload:
    data = path.read_bytes()
    return ImageUpload(data=data, filename=path.name, mime_type=sniff_mime(data) or "image/png")


def send_one(ctx: RunContext, req: PlannedRequest, contents: list[dict[str, Any]] | None = None) -> Result:
    """Send one request and return what the client read (raises the client's errors).

    `contents` is the full native history for a chain turn; without it the request is built from `req`.
    """
    client, job, key = ctx.client, req.job, req.idempotency_key
    observer = _Journaler(ctx, req)
    route = req.route
    if route is Route.NATIVE:
        image_size, ratio = _image_options(job)
        body = {
            "contents": contents or [user_content(req.prompt, req.reference_images)],
            "generationConfig": {
                "responseModalities": ["IMAGE"],
                "candidateCount": 1,
                "imageConfig": {"imageSize": image_size, "aspectRatio": ratio},
            },
        }
        return client.generate_content(
            job.model, body, idempotency_key=key, max_images=job.max_images, observer=observer
        )
    if route is Route.CHAT:
        image_size, ratio = _image_options(job)
        chat = {
            "model": job.model,
            "messages": [{"role": "user", "content": req.prompt}],
            "n": 1,
            "stream": False,
            "native": {"image_config": {"image_size": image_size, "aspect_ratio": ratio}},
        }
        return client.chat_completions(
            chat, idempotency_key=key, max_images=job.max_images, observer=observer
        )
    if route in (Route.IMAGES_GENERATIONS, Route.IMAGES_EDITS):
        fields = {
            "model": job.model,
            "prompt": req.prompt,
            "n": 1,
            "size": job.size or DEFAULT_IMAGES_API_SIZE,
        }
        if route is Route.IMAGES_GENERATIONS:
            return client.images_generate(fields, idempotency_key=key, observer=observer)
        uploads = [_upload(p) for p in req.reference_images]
        mask = _upload(req.mask) if req.mask else None
        return client.images_edit(fields, uploads, mask=mask, idempotency_key=key, observer=observer)
    if route is Route.MESSAGES:
        messages = {
            "model": job.model,
            "max_tokens": job.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": [{"role": "user", "content": req.prompt}],
        }
        return client.messages(messages, idempotency_key=key, observer=observer)
    return client.responses({"model": job.model, "input": req.prompt}, idempotency_key=key, observer=observer)


class _Journaler:
    """The client's attempt observer: write-ahead journal before sending, usage line after."""

    def __init__(self, ctx: RunContext, req: PlannedRequest) -> None:
        self.ctx = ctx
        self.ids = {
            "idempotency_key": req.idempotency_key,
            "job_id": req.job_id,
            "request_index": req.request_index,
            "turn_index": req.turn_index,
        }

    def __call__(self, event: AttemptEvent) -> None:
        store = self.ctx.store
        common = {
            **self.ids,
            "route": str(event.route),
            "model": event.model,
            "attempt": event.attempt,
            "started_at": event.started_at.isoformat(),
        }
        if isinstance(event, AttemptStarted):
            self.ctx.started_keys.add(event.idempotency_key)
            store.journal("attempt_started", **common)
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
        store.journal("attempt_finished", **common, status=event.status, **finished)
        store.append_usage({**common, **finished, "http_status": event.status, "usage": event.usage})
        if event.retry_in is not None:
            _run_logger().warning(
                "%s attempt %d: %s; retrying in %g s",
                self.ids["job_id"],
                event.attempt,
                _describe(event),
                event.retry_in,
            )


def _describe(event: AttemptFinished) -> str:
    if event.status is not None:
        return f"HTTP {event.status} {event.error_code or ''}".strip()
    return event.error_message or event.outcome


def _run_logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """Prefect's run logger inside a task (so the waits show in the Prefect UI), else ours."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return logger


# --- files and records ---------------------------------------------------------------------------------


def file_stem(req: PlannedRequest, chain: bool) -> str:
    """`<job>/<request>[-t<turn>]-<key>`: one folder per job (ids are unique, so names cannot collide),
    and the key in the name, so an edited row's image never overwrites the one its old key points to."""
    turn = f"-t{req.turn_index}" if chain else ""
    return f"{req.job_id}/{req.request_index}{turn}-{req.idempotency_key.removeprefix('ib1-')[:12]}"


def _record(req: PlannedRequest, status: str, **fields: Any) -> RequestRecord:
    return RequestRecord(
        job_id=req.job_id,
        request_index=req.request_index,
        turn_index=req.turn_index,
        status=status,  # type: ignore[arg-type]
        model=req.model,
        route=str(req.route),
        idempotency_key=req.idempotency_key,
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
        return _record(req, "succeeded", paths=[f"images/{n}" for n, _ in files], **common), files
    if isinstance(result, NoImageResult):
        detail = {
            "finish_reason": result.finish_reason,
            "text": result.text,
            "prompt_feedback": result.prompt_feedback,
        }
        files = [(f"{stem}.no_image.json", json.dumps(detail, indent=2).encode())]
        why = f"no image (finishReason {result.finish_reason})" + (f": {result.text}" if result.text else "")
        record = _record(
            req,
            "no_image",
            paths=[f"images/{files[0][0]}"],
            finish_reason=result.finish_reason,
            error=why,
            **common,
        )
        return record, files
    files = [
        (f"{stem}{f'-{k}' if k else ''}{EXTENSIONS[image.mime_type]}", image.data)
        for k, image in enumerate(result.images)
    ]
    first = result.images[0]
    record = _record(
        req,
        "succeeded",
        paths=[f"images/{n}" for n, _ in files],
        images=len(files),
        width=first.width,
        height=first.height,
        mime_type=first.mime_type,
        finish_reason=result.finish_reason,
        **common,
    )
    return record, files


def _failure(ctx: RunContext, req: PlannedRequest, exc: GatewayError) -> RequestRecord:
    """The record of a request that raised; stops the run on errors every later request would share."""
    request_id = getattr(exc, "request_id", None)
    if isinstance(exc, AuthenticationError):
        ctx.stop_dispatch("the service refused the API key (HTTP 401): set IMAGEBATCH_API_KEY to a valid key")
    elif isinstance(exc, InsufficientFundsError):
        ctx.stop_dispatch("the account has insufficient funds (HTTP 402): top it up, then rerun")
    elif isinstance(exc, NotFoundError) and exc.code != "model_not_found":
        ctx.stop_dispatch(f"the service answered 404 ({exc.message}): check the base URL (the service root)")
    elif isinstance(exc, ServiceUnreachableError):
        ctx.stop_dispatch(f"{exc.message}: check the base URL and the network")
    error = str(exc) if isinstance(exc, APIStatusError) else exc.message
    if exc.may_have_been_billed:
        return _record(
            req, "unknown", attempts=exc.attempts, request_id=request_id, error=f"{error}; {UNKNOWN_HINT}"
        )
    return _record(req, "failed", attempts=exc.attempts, request_id=request_id, error=error)


def carried(ctx: RunContext, req: PlannedRequest) -> RequestRecord:
    """The record of a request this run does not send: succeeded before (skipped), no_image, or unknown."""
    state = ctx.states.get(req.idempotency_key)
    previous = state.outcome if state else None
    if previous is not None and previous.status == "succeeded":
        return dataclasses.replace(previous, status="skipped")
    if previous is not None:
        return previous
    attempts = state.attempts if state else 0
    return _record(
        req, "unknown", attempts=attempts, error=f"sent, but no answer was recorded; {UNKNOWN_HINT}"
    )


def not_attempted(req: PlannedRequest, why: str) -> RequestRecord:
    return _record(req, "not_attempted", error=why)


def send_and_record(
    ctx: RunContext,
    req: PlannedRequest,
    contents: list[dict[str, Any]] | None = None,
    chain: bool = False,
    on_answer: Callable[[Result], None] | None = None,
) -> tuple[RequestRecord, Result | None]:
    """Send one request, save its answer in the crash-safe order, journal the outcome.

    `on_answer` runs after the answer is journaled and before its files are written (a chain saves its
    history there, so a turn that counts as done on disk is always in the history).
    """
    store = ctx.store
    try:
        result = send_one(ctx, req, contents)
    except GatewayError as exc:
        record = _failure(ctx, req, exc)
        store.record_outcome(record)
        return record, None
    record, files = plan_files(req, result, chain)
    try:
        store.journal("answered", **asdict(record))
        if on_answer is not None:
            on_answer(result)
        for name, data in files:
            store.write_file(name, data)
    except OSError as exc:
        record = _record(
            req,
            "unknown",
            attempts=result.attempts,
            request_id=result.request_id,
            error=f"answered (and billed) but could not be saved: {exc}; free space, then --retry-unknown",
        )
    store.record_outcome(record)
    return record, result


# --- units ---------------------------------------------------------------------------------------------


def run_unit(ctx: RunContext, unit: Unit, records: list[RequestRecord] | None = None) -> list[RequestRecord]:
    """Send the request(s) of one unit, in order, and return one record per request.

    Records are appended to `records` (when given) as each request settles, so a caller that catches an
    exception still has the records of the requests before it.
    """
    records = [] if records is None else records
    if not unit.is_chain:
        req = unit.requests[0]
        decision = ctx.decision(req.idempotency_key)
        if decision != "send":
            records.append(carried(ctx, req))
        elif ctx.halt.is_set():
            records.append(not_attempted(req, ctx.halt_reason or "the run was stopped"))
        else:
            records.append(send_and_record(ctx, req)[0])
        return records
    return _run_chain(ctx, unit, records)


def _run_chain(ctx: RunContext, unit: Unit, records: list[RequestRecord]) -> list[RequestRecord]:
    """Turns in order. A turn is sent with every earlier turn exactly as sent and as returned; a chain
    stops at the first turn that did not succeed, and a done turn is never sent again to rebuild history."""
    first = unit.requests[0]
    history = _saved_history(ctx, unit)
    blocked: str | None = None
    for req in unit.requests:
        if blocked:
            records.append(not_attempted(req, blocked))
            continue
        decision = ctx.decision(req.idempotency_key)
        if decision != "send":
            records.append(carried(ctx, req))
            if decision == "carry":
                blocked = f"turn {req.turn_index} of this chain is {records[-1].status}"
            continue
        if ctx.halt.is_set():
            records.append(not_attempted(req, ctx.halt_reason or "the run was stopped"))
            blocked = records[-1].error
            continue
        if len(history) < req.turn_index:
            path = ctx.store.chain_path(first.job_id, first.request_index).relative_to(ctx.store.root)
            records.append(
                _record(
                    req,
                    "failed",
                    error=f"{path} lacks the earlier turns this turn must send back; "
                    "rerun with --force to make the whole chain again (each turn is billed)",
                )
            )
            blocked = f"turn {req.turn_index} could not be sent"
            continue
        contents = [c for turn in history[: req.turn_index] for c in turn["contents"]]
        contents.append(user_content(req.prompt, req.reference_images))

        def keep_history(result: Result, req: PlannedRequest = req, contents: list[Any] = contents) -> None:
            # Saved before the turn's files: a turn that counts as done on disk is always in the history.
            model_content = getattr(result, "model_content", None)
            if isinstance(result, ImageResult) and model_content is not None:
                del history[req.turn_index :]
                history.append({"key": req.idempotency_key, "contents": [contents[-1], model_content]})
                saved = {"job_id": first.job_id, "turns": history}
                ctx.store.save_chain(first.job_id, first.request_index, saved)

        record, _ = send_and_record(ctx, req, contents, chain=True, on_answer=keep_history)
        if record.status != "succeeded":
            blocked = f"turn {req.turn_index} of this chain is {record.status}"
        records.append(record)
    return records


def _saved_history(ctx: RunContext, unit: Unit) -> list[dict[str, Any]]:
    """The saved turns of a chain, as far as their keys still match the plan (and none when forcing)."""
    if ctx.force:
        return []
    first = unit.requests[0]
    saved = ctx.store.load_chain(first.job_id, first.request_index) or {}
    turns: list[dict[str, Any]] = []
    for turn, req in zip(saved.get("turns", []), unit.requests, strict=False):
        if turn.get("key") != req.idempotency_key:
            break
        turns.append(turn)
    return turns


def run_unit_safely(ctx: RunContext, unit: Unit) -> list[RequestRecord]:
    """`run_unit`, but a bug in it must not lose the other requests' records or misreport this unit's:
    requests settled before the error keep their records; of the rest, one with an attempt started in
    this run is `unknown`, the others `not_attempted`."""
    records: list[RequestRecord] = []
    try:
        return run_unit(ctx, unit, records)
    except Exception as exc:
        _run_logger().exception("%s: internal error", unit.name)
        why = f"internal error: {type(exc).__name__}: {exc}"
        return records + [
            _record(req, "unknown", error=f"{why}; {UNKNOWN_HINT}")
            if req.idempotency_key in ctx.started_keys
            else not_attempted(req, why)
            for req in unit.requests[len(records) :]
        ]
