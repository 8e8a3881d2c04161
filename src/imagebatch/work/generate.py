"""The Prefect task that sends one batch of units; the plain functions it runs are in `work.unit`.

A unit is one request, or for an edit chain the ordered turns of one request (each turn is its own billed
request with its own key and results row). A batch is consecutive units, one Prefect task run (see
`context.Batch`). Records go to the run context, never back through Prefect.
"""

from __future__ import annotations

import contextvars
from concurrent.futures import Future, wait
from typing import Any, Protocol

from prefect import task
from prefect.cache_policies import NO_CACHE

from imagebatch.work.context import Batch, Unit
from imagebatch.work.outcome import batch_state
from imagebatch.work.store import RequestRecord


class RequestPool(Protocol):
    """The run's request threads, which the flow owns (`run.dispatch.RequestThreads`; the picture of the
    task's part and the flow's part of sending a unit is in `run/dispatch.py`).

    `send` runs `settle(ctx, unit)` on one of them, in `context`, and tells the flow's dispatcher once the
    unit has finished: it is the one call from a task back up into the flow."""

    def send(self, unit: Unit, context: contextvars.Context | None = None) -> Future[None]: ...

    def records(self, unit: Unit) -> list[RequestRecord]:
        """The records of a unit that has finished."""
        ...


@task(
    name="generate",
    task_run_name="{batch.name}",
    cache_policy=NO_CACHE,
    retries=0,  # the spec's schedule is applied per route by the client, not by re-running the task
)
def generate(batch: Batch, pool: RequestPool) -> Any:
    """Send the units of `batch` as the dispatcher admits them, each on `pool` (the run's request threads,
    shared by every batch, so a batch's tail never idles a slot), and wait for them. The records go to
    the run context's `results`, never bytes. Each unit runs in this task run's context: its log lines
    are the task's. Returns the task run's state: Failed with the counts when a request is not done
    (`outcome.batch_state`), else None (Completed)."""
    ran: list[Unit] = []
    futures: list[Future[None]] = []
    for unit in batch:
        ran.append(unit)
        futures.append(pool.send(unit, contextvars.copy_context()))
    wait(futures)
    return batch_state(r for unit in ran for r in pool.records(unit))
