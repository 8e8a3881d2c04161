"""How a unit's records are kept as its requests settle: as they come, or under the safety net that
records its outcome whatever happens.

The run's request threads send under the safety net (`settled`); a caller that wants an error to go up
(a test's crash, a rerun settled without Prefect) takes them as they come (`as_they_come`).

A unit's path (`work.unit.run_plain`, `work.chain.run_chain`) sends inside the context manager it is given,
which yields the list each request's record is appended to.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from imagebatch.storage.layout import UNKNOWN_HINT
from imagebatch.work import records
from imagebatch.work.context import RunContext, Unit
from imagebatch.work.store import RequestRecord

logger = logging.getLogger("imagebatch.run")

Keeping = Callable[[RunContext, Unit], AbstractContextManager[list[RequestRecord]]]
"""How a unit's records are kept: `as_they_come`, or `settled`."""


@contextlib.contextmanager
def as_they_come(_ctx: RunContext, _unit: Unit) -> Iterator[list[RequestRecord]]:
    """The unit's records, appended as each request settles; an error goes up to the caller."""
    yield []


@contextlib.contextmanager
def settled(ctx: RunContext, unit: Unit) -> Iterator[list[RequestRecord]]:
    """The unit's records, kept in `ctx.state.results` whatever happens: a bug while sending must not
    lose the other requests' records or misreport this unit's. Requests settled before the error keep
    their records; of the rest, one with an attempt started in this run is `unknown`, the others
    `not_attempted`."""
    out: list[RequestRecord] = []
    try:
        yield out
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
    ctx.state.started_keys.release(req.idempotency_key for req in unit.requests)
