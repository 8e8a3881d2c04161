"""The Prefect task that sends one batch of units, and the plain functions it wraps.

A unit is one request, or for an edit chain the ordered turns of one request (each turn is its own billed
request with its own key and results row). A batch is consecutive units, one Prefect task run (see
`context.Batch`). Records go to the run context, never back through Prefect.
"""

from __future__ import annotations

import contextvars
import logging
from concurrent.futures import Future, wait
from typing import Protocol

from prefect import task
from prefect.cache_policies import NO_CACHE

from . import records
from .build import InputChangedError, build_request
from .chain import run_chain
from .context import Batch, RunContext, Unit
from .layout import UNKNOWN_HINT
from .send import send_and_record
from .store import RequestRecord

logger = logging.getLogger("imagebatch.run")


def run_unit(ctx: RunContext, unit: Unit, out: list[RequestRecord] | None = None) -> list[RequestRecord]:
    """Send the request(s) of one unit, in order, and return one record per request.

    Records are appended to `out` (when given) as each request settles, so a caller that catches an
    exception still has the records of the requests before it.
    """
    out = [] if out is None else out
    if unit.is_chain:
        return run_chain(ctx, unit, out)
    req = unit.requests[0]
    if ctx.decision(req.idempotency_key) != "send":
        out.append(records.carried(req, ctx.states.get(req.idempotency_key)))
    elif ctx.halt.is_set():
        out.append(records.not_attempted(req, ctx.halt_reason or "the run was stopped"))
    else:
        try:
            request = build_request(req)
        except InputChangedError as exc:
            out.append(records.record(req, "failed", error=str(exc)))
        else:
            out.append(send_and_record(ctx, req, request)[0])
    return out


def run_unit_safely(ctx: RunContext, unit: Unit) -> list[RequestRecord]:
    """`run_unit`, but a bug in it must not lose the other requests' records or misreport this unit's:
    requests settled before the error keep their records; of the rest, one with an attempt started in
    this run is `unknown`, the others `not_attempted`."""
    out: list[RequestRecord] = []
    try:
        return run_unit(ctx, unit, out)
    except Exception as exc:
        logger.exception("%s: internal error", unit.name)
        why = f"internal error: {type(exc).__name__}: {exc}"
        return out + [
            records.record(req, "unknown", error=f"{why}; {UNKNOWN_HINT}")
            if req.idempotency_key in ctx.started_keys
            else records.not_attempted(req, why)
            for req in unit.requests[len(out) :]
        ]


class RequestPool(Protocol):
    """The run's request threads, which the flow owns (`flows.dispatch.RequestThreads`; the picture of the
    task's part and the flow's part of sending a unit is in `flows/dispatch.py`).

    `send` runs `settle(ctx, unit)` on one of them, in `context`, and tells the flow's dispatcher once the
    unit has finished: it is the one call from a task back up into the flow."""

    def send(self, unit: Unit, context: contextvars.Context | None = None) -> Future[None]: ...


@task(
    name="generate",
    task_run_name="{batch.name}",
    cache_policy=NO_CACHE,
    retries=0,  # the spec's schedule is applied per route by the client, not by re-running the task
)
def generate(batch: Batch, pool: RequestPool) -> None:
    """Send the units of `batch` as the dispatcher admits them, each on `pool` (the run's request threads,
    shared by every batch, so a batch's tail never idles a slot), and wait for them. The records go to
    the run context's `results`, never bytes. Each unit runs in this task run's context: its log lines
    are the task's."""
    wait([pool.send(unit, contextvars.copy_context()) for unit in batch])


def settle(ctx: RunContext, unit: Unit) -> None:
    """Send one unit and keep its records in `ctx.results` (never raises for our own errors)."""
    ctx.results[unit.index] = run_unit_safely(ctx, unit)
