"""One unit of work, sent and recorded, with no Prefect in sight: the plain functions the `generate` task
(`run.batches`) runs on the run's request threads, also used where Prefect is not started
(`run.nothing_to_send`: a rerun with nothing to send).

A unit is one request, or for an edit chain the ordered turns of one request (each turn is its own billed
request with its own key and results row).
"""

from __future__ import annotations

from collections.abc import Callable

from imagebatch.gateway.constants import Route
from imagebatch.work import conversation, records
from imagebatch.work.build import InputChangedError, build_request
from imagebatch.work.chain import run_chain
from imagebatch.work.context import RunContext, Unit
from imagebatch.work.keeping import Keeping, as_they_come, settled
from imagebatch.work.send import send_and_record
from imagebatch.work.store import RequestRecord


def run_unit(ctx: RunContext, unit: Unit, keep: Keeping = as_they_come) -> list[RequestRecord]:
    """Send the request(s) of one unit, in order, and return one record per request, kept by `keep`."""
    return unit_path(unit)(ctx, unit, keep)


def settle(ctx: RunContext, unit: Unit) -> list[RequestRecord]:
    """`run_unit` under `settled`'s safety net: its records kept in `ctx.state.results` and returned."""
    return run_unit(ctx, unit, settled)


def unit_path(unit: Unit) -> Callable[[RunContext, Unit, Keeping], list[RequestRecord]]:
    """How `unit` is sent: the turns of a chain in order (`work.chain`), or one request."""
    return run_chain if unit.is_chain else run_plain


def run_plain(ctx: RunContext, unit: Unit, keep: Keeping = as_they_come) -> list[RequestRecord]:
    """Send the one request of `unit` (a plain request, or a variant: not a turn of a chain being made)
    if the run is to send it; its record kept by `keep`. On the native route its conversation is kept
    (`work.conversation`) for a later edit."""
    req = unit.requests[0]
    with keep(ctx, unit) as out:
        if ctx.decision(req.idempotency_key) != "send":
            out.append(records.carried(req, ctx.states.get(req.idempotency_key)))
            return out
        if ctx.state.halt.is_set():
            out.append(records.not_attempted(req, ctx.state.halt_reason or "the run was stopped"))
            return out
        chain, on_answer = bool(req.job.turns), None
        try:
            if req.route is Route.NATIVE:
                before = conversation.earlier(ctx.store, req)
                request = build_request(req, before.sent(ctx.store, req))
                sent_turn = request.json["contents"][-1] if request.json else {}
                on_answer = conversation.keeper(ctx.store, req, before, sent_turn)
            else:
                request = build_request(req)
        except (InputChangedError, conversation.HistoryError) as exc:
            out.append(records.record(req, "failed", error=str(exc)))
            return out
        out.append(send_and_record(ctx, req, request, chain, on_answer=on_answer)[0])
    return out
