"""Send one request and keep what came back, in the order that makes a crash at any moment safe:

1. `attempt_started` is journaled (and synced) before each HTTP attempt, `attempt_finished` after it;
2. a success is journaled as `answered`, naming the files it will write, before any file is written;
3. the files are written atomically (and a chain's history saved);
4. the `outcome` is journaled.

A rerun that finds `answered` with all its files on disk takes it as done; anything sent without a settled
answer is `unknown` and is not sent again unless the user asks. Nothing here returns image bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from imagebatch.gateway.errors import GatewayError
from imagebatch.gateway.requests import GatewayRequest
from imagebatch.gateway.results import AttemptEvent, AttemptFinished, AttemptStarted
from imagebatch.manifest import PlannedRequest
from imagebatch.work import records
from imagebatch.work.attempts import AttemptJournal, NotJournaledError
from imagebatch.work.context import RunContext
from imagebatch.work.records import Result
from imagebatch.work.request_record import RequestRecord


class _StoppedBeforeSending(Exception):
    """Raised by the attempt observer: the run stopped before this request's first attempt was sent."""


def send_and_record(
    ctx: RunContext,
    req: PlannedRequest,
    request: GatewayRequest,
    chain: bool = False,
    on_answer: Callable[[Result, RequestRecord], None] | None = None,
) -> tuple[RequestRecord, Result | None]:
    """Send `request` (the wire form of `req`), save its answer in the crash-safe order, journal the outcome.

    `on_answer(result, record)` runs after the answer is journaled and before its files are written (a
    chain saves its history there, so a turn that counts as done on disk is always in the history; a native
    request its conversation, `work.conversation`).
    """
    state = ctx.states.get(req.idempotency_key)
    earlier = state.attempts if state else 0  # results.csv and usage.jsonl count attempts across runs
    observe = _observer(ctx, AttemptJournal(ctx.store, req, ctx.state.started_keys, earlier))
    if ctx.state.pace is not None:
        ctx.state.pace()
    try:
        result = ctx.client.send(request, idempotency_key=req.idempotency_key, observer=observe)
    except _StoppedBeforeSending:
        return records.not_attempted(req, ctx.state.halt_reason or "the run was stopped"), None
    except NotJournaledError as exc:  # a failed write stopped it before (this) attempt was sent
        record = records.not_journaled(req, exc.attempt, ctx.state.halt_reason or str(exc))
        record.attempts += earlier if record.attempts else 0
        _record_outcome(ctx, record)
        return record, None
    except GatewayError as exc:
        reason = records.halt_reason(exc, ctx.key_source)
        if reason:
            ctx.state.stop(reason)
        record = records.failure(req, exc)
        record.attempts += earlier
        _record_outcome(ctx, record)
        return record, None
    return _keep(ctx, req, result, chain, on_answer, earlier), result


def _observer(ctx: RunContext, journal: AttemptJournal) -> Callable[[AttemptEvent], None]:
    """The client's observer of each attempt: journals it, notes a 429, and sends nothing once stopped."""

    def observe(event: AttemptEvent) -> None:
        if isinstance(event, AttemptStarted) and event.attempt == 1 and ctx.state.halt.is_set():
            # It waited (for a slot of the account's limit, or for --rpm's pacing) while the run stopped:
            # a request not yet sent is not sent. (A retry of one sent before the stop still is: the
            # requests in flight finish.)
            raise _StoppedBeforeSending
        journal(event)
        if isinstance(event, AttemptFinished) and event.status == 429:
            ctx.state.saw_429()

    return observe


def _keep(
    ctx: RunContext,
    req: PlannedRequest,
    result: Result,
    chain: bool,
    on_answer: Callable[[Result, RequestRecord], None] | None,
    earlier: int,
) -> RequestRecord:
    """An answer kept in the crash-safe order (steps 2 to 4 of the module docstring); its record."""
    store = ctx.store
    record, files = records.plan_files(req, result, chain)
    record.attempts += earlier
    written: list[tuple[str, bytes]] = []
    try:
        store.journal("answered", **asdict(record))
        if on_answer is not None:
            on_answer(result, record)
        for name, data in files:
            written.append((store.write_file(name, data), data))
    except OSError as exc:
        record = records.unsaved(req, result, exc)
        record.attempts += earlier
    _record_outcome(ctx, record)
    if record.status == "succeeded" and ctx.thumbnails:  # the report's, from the bytes still in memory
        for rel, data in written:
            if rel.endswith((".png", ".jpg")):
                store.thumbnail(rel, data)
    return record


def _record_outcome(ctx: RunContext, record: RequestRecord) -> None:
    """Journal the outcome; when that write fails (the store has stopped the run), the record still goes
    to results.csv; a rerun reads the journal's earlier lines (`answered` with its files, or `unknown`)."""
    try:
        ctx.store.record_outcome(record)
    except OSError:
        pass
