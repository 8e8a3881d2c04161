"""One unit of work, sent and recorded, with no Prefect in sight: the plain functions the `generate` task
(`run.batches`) runs on the run's request threads, also used where Prefect is not started
(`run.nothing_to_send`: a rerun with nothing to send).

A unit is one request, or for an edit chain the ordered turns of one request (each turn is its own billed
request with its own key and results row).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from imagebatch.gateway.constants import Route
from imagebatch.storage.layout import UNKNOWN_HINT
from imagebatch.work import conversation, records
from imagebatch.work.build import InputChangedError, build_request
from imagebatch.work.chain import run_chain
from imagebatch.work.context import RunContext, Unit
from imagebatch.work.send import send_and_record
from imagebatch.work.store import RequestRecord

logger = logging.getLogger("imagebatch.run")


def run_unit(ctx: RunContext, unit: Unit, out: list[RequestRecord] | None = None) -> list[RequestRecord]:
    """Send the request(s) of one unit, in order, and return one record per request.

    Records are appended to `out` (when given) as each request settles, so a caller that catches an
    exception still has the records of the requests before it.
    """
    out = [] if out is None else out
    return _path(unit)(ctx, unit, out)


def _path(unit: Unit) -> Callable[[RunContext, Unit, list[RequestRecord]], list[RequestRecord]]:
    """How `unit` is sent: the turns of a chain in order (`work.chain`), or one request."""
    return run_chain if unit.is_chain else run_plain


def run_plain(ctx: RunContext, unit: Unit, out: list[RequestRecord]) -> list[RequestRecord]:
    """Send the one request of `unit` (a plain request, or a variant: not a turn of a chain being made)
    if the run is to send it, and append its record to `out`. On the native route its conversation is
    kept (`work.conversation`) for a later edit."""
    req = unit.requests[0]
    if ctx.decision(req.idempotency_key) != "send":
        out.append(records.carried(req, ctx.states.get(req.idempotency_key)))
        return out
    if ctx.state.halt.is_set():
        out.append(records.not_attempted(req, ctx.state.halt_reason or "the run was stopped"))
        return out
    chain, keep = bool(req.job.turns), None
    try:
        if req.route is Route.NATIVE:
            before = conversation.earlier(ctx.store, req)
            request = build_request(req, before.sent(ctx.store, req))
            sent_turn = request.json["contents"][-1] if request.json else {}
            keep = conversation.keeper(ctx.store, req, before, sent_turn)
        else:
            request = build_request(req)
    except (InputChangedError, conversation.HistoryError) as exc:
        out.append(records.record(req, "failed", error=str(exc)))
        return out
    out.append(send_and_record(ctx, req, request, chain, on_answer=keep)[0])
    return out


def settle(ctx: RunContext, unit: Unit) -> list[RequestRecord]:
    """`run_unit`, its records kept in `ctx.state.results` and returned; a bug in it must not lose the other
    requests' records or misreport this unit's: requests settled before the error keep their records; of
    the rest, one with an attempt started in this run is `unknown`, the others `not_attempted`."""
    out: list[RequestRecord] = []
    try:
        _path(unit)(ctx, unit, out)
    except Exception as exc:
        logger.exception("%s: internal error", unit.name)
        why = f"internal error: {type(exc).__name__}: {exc}"
        out += [
            records.record(req, "unknown", error=f"{why}; {UNKNOWN_HINT}")
            if req.idempotency_key in ctx.state.started_keys
            else records.not_attempted(req, why)
            for req in unit.requests[len(out) :]
        ]
    ctx.state.results[unit.index] = out
    return out
