"""One unit of work: send the request(s) of one planned job request, save what came back, record the outcome.

A unit is one request, or for an edit chain the ordered turns of one request (each turn is its own billed
request with its own key and results row). Every attempt is journaled before it is sent. Nothing here
returns image bytes: the caller gets small `RequestRecord`s.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebatch.gateway.client import (
    AttemptEvent,
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
    OutcomeUnknownError,
)
from imagebatch.gateway.imagefile import EXTENSIONS, sniff_mime

from .manifest import Job, PlannedRequest
from .store import DONE_STATUSES, KeyState, OutputStore, RequestRecord

UNKNOWN_HINT = "no answer was recorded; check the usage history, then rerun with --retry-unknown"


@dataclass
class Unit:
    """The requests one task sends: one, or the turns of one chain in order."""

    job: Job
    requests: list[PlannedRequest]

    @property
    def name(self) -> str:
        return f"{self.job.id}#{self.requests[0].request_index}"

    @property
    def is_chain(self) -> bool:
        return len(self.requests) > 1 or bool(self.job.turns)


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

    def stop_dispatch(self, reason: str) -> None:
        if not self.halt.is_set():
            self.halt_reason = reason
            self.halt.set()

    def decision(self, key: str) -> str:
        """`send`, `skip` (done before), or `unknown` (left alone) for a request key."""
        if self.force:
            return "send"
        status = self.states[key].status if key in self.states else None
        if status in DONE_STATUSES:
            return "skip"
        if status == "unknown" and not self.retry_unknown:
            return "unknown"
        return "send"


# --- request bodies ------------------------------------------------------------------------------------


def _image_part(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {"inlineData": {"mimeType": sniff_mime(data), "data": base64.b64encode(data).decode()}}


def user_content(prompt: str, reference_images: Sequence[Path]) -> dict[str, Any]:
    """A native user turn: the text first, then each reference image as its own part."""
    return {"role": "user", "parts": [{"text": prompt}, *(_image_part(p) for p in reference_images)]}


def native_generation_config(job: Job) -> dict[str, Any]:
    return {
        "responseModalities": ["IMAGE"],
        "candidateCount": 1,
        "imageConfig": {
            "imageSize": job.image_size or DEFAULT_IMAGE_SIZE,
            "aspectRatio": job.aspect_ratio or DEFAULT_ASPECT_RATIO,
        },
    }


def _upload(path: Path) -> ImageUpload:
    data = path.read_bytes()
    mime = sniff_mime(data) or "image/png"
    return ImageUpload(data=data, filename=path.name, mime_type=mime)


def send_one(
    ctx: RunContext, job: Job, req: PlannedRequest, prompt: str, history: list[dict[str, Any]] | None = None
) -> ImageResult | NoImageResult | TextResult:
    """Send one request of `job` and return what the client read (raises the client's errors)."""
    client = ctx.client
    observer = _Journaler(ctx.store, req)
    key = req.idempotency_key
    route = Route(req.route)
    if route is Route.NATIVE:
        contents = history or [user_content(prompt, job.reference_images)]
        body = {"contents": contents, "generationConfig": native_generation_config(job)}
        return client.generate_content(
            job.model, body, idempotency_key=key, max_images=job.max_images, observer=observer
        )
    if route is Route.CHAT:
        chat_body: dict[str, Any] = {
            "model": job.model,
            "messages": [{"role": "user", "content": prompt}],
            "n": 1,
            "stream": False,
            "native": {
                "image_config": {
                    "image_size": job.image_size or DEFAULT_IMAGE_SIZE,
                    "aspect_ratio": job.aspect_ratio or DEFAULT_ASPECT_RATIO,
                }
            },
        }
        return client.chat_completions(
            chat_body, idempotency_key=key, max_images=job.max_images, observer=observer
        )
    if route in (Route.IMAGES_GENERATIONS, Route.IMAGES_EDITS):
        fields = {"model": job.model, "prompt": prompt, "n": 1, "size": job.size or DEFAULT_IMAGES_API_SIZE}
        if route is Route.IMAGES_GENERATIONS:
            return client.images_generate(fields, idempotency_key=key, observer=observer)
        uploads = [_upload(p) for p in job.reference_images]
        mask = _upload(job.mask) if job.mask else None
        return client.images_edit(fields, uploads, mask=mask, idempotency_key=key, observer=observer)
    if route is Route.MESSAGES:
        msg_body = {
            "model": job.model,
            "max_tokens": job.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": [{"role": "user", "content": prompt}],
        }
        return client.messages(msg_body, idempotency_key=key, observer=observer)
    return client.responses({"model": job.model, "input": prompt}, idempotency_key=key, observer=observer)


class _Journaler:
    """The client's attempt observer: write-ahead journal before sending, usage line after."""

    def __init__(self, store: OutputStore, req: PlannedRequest) -> None:
        self.store = store
        self.ids = {
            "idempotency_key": req.idempotency_key,
            "job_id": req.job_id,
            "request_index": req.request_index,
            "turn_index": req.turn_index,
        }

    def __call__(self, event: AttemptEvent) -> None:
        common = {
            **self.ids,
            "route": str(event.route),
            "model": event.model,
            "attempt": event.attempt,
            "started_at": event.started_at.isoformat(),
        }
        if isinstance(event, AttemptStarted):
            self.store.journal("attempt_started", **common)
            return
        finished = {
            "duration_s": round(event.duration, 4),
            "status": event.status,
            "outcome": event.outcome,
            "error_code": event.error_code
            or (event.outcome if event.outcome != "ok" and not event.status else None),
            "request_id": event.request_id,
            "images": event.images,
            "retry_in": event.retry_in,
        }
        self.store.journal("attempt_finished", **common, **finished)
        usage_line = {**common, **finished, "http_status": event.status, "usage": event.usage}
        usage_line.pop("status")
        self.store.append_usage(usage_line)


# --- outcomes ------------------------------------------------------------------------------------------


def file_stem(req: PlannedRequest, chain: bool) -> str:
    """`<job>_<request>`, plus `_t<turn>` for chain turns: stable names, so reruns overwrite not pile up."""
    stem = f"{req.job_id}_{req.request_index}"
    return f"{stem}_t{req.turn_index}" if chain else stem


def _record(req: PlannedRequest, job: Job, status: str, **fields: Any) -> RequestRecord:
    return RequestRecord(
        job_id=req.job_id,
        request_index=req.request_index,
        turn_index=req.turn_index,
        status=status,  # type: ignore[arg-type]
        model=job.model,
        route=str(req.route),
        idempotency_key=req.idempotency_key,
        **fields,
    )


def save_result(
    ctx: RunContext,
    job: Job,
    req: PlannedRequest,
    result: ImageResult | NoImageResult | TextResult,
    chain: bool,
) -> RequestRecord:
    """Write the files of a successful answer atomically and return its record."""
    stem = file_stem(req, chain)
    store = ctx.store
    if isinstance(result, TextResult):
        paths = [
            store.write_file(f"{stem}.txt", result.text.encode()),
            store.write_file(f"{stem}.json", json.dumps(result.raw, indent=2).encode()),
        ]
        return _record(
            req, job, "succeeded", paths=paths, attempts=result.attempts, request_id=result.request_id
        )
    if isinstance(result, NoImageResult):
        detail = {
            "finish_reason": result.finish_reason,
            "text": result.text,
            "prompt_feedback": result.prompt_feedback,
        }
        path = store.write_file(f"{stem}.no_image.json", json.dumps(detail, indent=2).encode())
        why = f"no image (finishReason {result.finish_reason})"
        if result.text:
            why += f": {result.text}"
        return _record(
            req,
            job,
            "no_image",
            paths=[path],
            attempts=result.attempts,
            finish_reason=result.finish_reason,
            error=why,
            request_id=result.request_id,
        )
    paths = []
    for k, image in enumerate(result.images):
        suffix = f"_{k}" if k else ""
        paths.append(store.write_file(f"{stem}{suffix}{EXTENSIONS[image.mime_type]}", image.data))
    first = result.images[0]
    return _record(
        req,
        job,
        "succeeded",
        paths=paths,
        images=len(result.images),
        width=first.width,
        height=first.height,
        mime_type=first.mime_type,
        attempts=result.attempts,
        finish_reason=result.finish_reason,
        request_id=result.request_id,
    )


def _failure(ctx: RunContext, job: Job, req: PlannedRequest, exc: GatewayError) -> RequestRecord:
    if isinstance(exc, OutcomeUnknownError):
        return _record(req, job, "unknown", attempts=exc.attempts, error=f"{exc.message}; {UNKNOWN_HINT}")
    if isinstance(exc, AuthenticationError):
        ctx.stop_dispatch("the service refused the API key (HTTP 401): set IMAGEBATCH_API_KEY to a valid key")
    elif isinstance(exc, InsufficientFundsError):
        ctx.stop_dispatch("the account has insufficient funds (HTTP 402): top it up, then rerun")
    request_id = exc.request_id if isinstance(exc, APIStatusError) else None
    return _record(req, job, "failed", attempts=exc.attempts, error=str(exc), request_id=request_id)


def _carried(ctx: RunContext, job: Job, req: PlannedRequest, decision: str) -> RequestRecord:
    """The record of a request this run does not send: done before (skipped) or left unknown."""
    state = ctx.states.get(req.idempotency_key)
    previous = state.outcome if state else None
    if decision == "skip" and previous is not None:
        carried = RequestRecord.from_json({**previous.__dict__, "status": "skipped"})
        return carried
    if previous is not None and previous.status == "unknown":
        return previous
    return _record(req, job, "unknown", attempts=state.attempts if state else 0, error=UNKNOWN_HINT)


def not_attempted(job: Job, req: PlannedRequest, why: str) -> RequestRecord:
    return _record(req, job, "not_attempted", error=why)


def run_unit(ctx: RunContext, unit: Unit) -> list[RequestRecord]:
    """Send the request(s) of one unit, in order, and return one record per request."""
    job = unit.job
    chain = unit.is_chain
    records: list[RequestRecord] = []
    history = _resume_history(ctx, unit) if chain else None
    for req in unit.requests:
        if records and records[-1].status not in ("succeeded", "skipped", "no_image"):
            records.append(
                not_attempted(job, req, f"turn {records[-1].turn_index} of this chain did not finish")
            )
            continue
        decision = ctx.decision(req.idempotency_key)
        if decision != "send":
            records.append(_carried(ctx, job, req, decision))
            if decision == "skip" and chain and history is not None:
                # Only skip a done turn if its history is on disk; otherwise it must be sent again.
                if len(history["turns"]) <= req.turn_index:
                    records[-1] = _send_and_record(ctx, job, req, history, chain)
            continue
        if ctx.halt.is_set():
            records.append(not_attempted(job, req, ctx.halt_reason or "the run was stopped"))
            continue
        records.append(_send_and_record(ctx, job, req, history, chain))
    return records


def _turn_prompt_and_refs(job: Job, turn_index: int) -> tuple[str, list[Path]]:
    if turn_index == 0:
        return job.prompt, list(job.reference_images)
    turn = job.turns[turn_index - 1]
    return turn.prompt, list(turn.reference_images)


def _send_and_record(
    ctx: RunContext, job: Job, req: PlannedRequest, history: dict[str, Any] | None, chain: bool
) -> RequestRecord:
    prompt, refs = _turn_prompt_and_refs(job, req.turn_index)
    contents = None
    if history is not None:
        # Earlier turns exactly as sent and as returned, then the new user turn.
        contents = [c for turn in history["turns"][: req.turn_index] for c in turn["contents"]]
        contents.append(user_content(prompt, refs))
    try:
        result = send_one(ctx, job, req, prompt, contents)
    except GatewayError as exc:
        record = _failure(ctx, job, req, exc)
        ctx.store.record_outcome(record)
        return record
    record = save_result(ctx, job, req, result, chain)
    if history is not None and contents is not None:
        model_content = getattr(result, "model_content", None)
        if model_content is None:
            record.status = "failed"
            record.error = "the answer carried no model turn to continue the chain from"
        else:
            del history["turns"][req.turn_index :]
            history["turns"].append({"key": req.idempotency_key, "contents": [contents[-1], model_content]})
            ctx.store.save_chain(job.id, req.request_index, history)
    ctx.store.record_outcome(record)
    return record


def _resume_history(ctx: RunContext, unit: Unit) -> dict[str, Any]:
    """The saved chain history, trimmed to the turns whose keys still match the plan."""
    saved = ctx.store.load_chain(unit.job.id, unit.requests[0].request_index) or {"turns": []}
    keys = [r.idempotency_key for r in unit.requests]
    turns = []
    for i, turn in enumerate(saved.get("turns", [])):
        if i >= len(keys) or turn.get("key") != keys[i] or ctx.force:
            break
        turns.append(turn)
    return {"job_id": unit.job.id, "request_index": unit.requests[0].request_index, "turns": turns}
