"""Dispatch: which units become Prefect tasks, how many are in flight, and when to stop submitting.

At most `concurrency` tasks are in flight; new ones are submitted as old ones finish, so a 100,000-row
manifest never holds 100,000 futures, and a 401 or 402 (or Ctrl-C, through `RunControl`) stops the run
before the rest is sent. Units this run sends nothing for never become tasks.
"""

from __future__ import annotations

import queue
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from imagebatch.tasks.context import RunContext, Unit
from imagebatch.tasks.generate import generate, run_unit, run_unit_safely


@dataclass(frozen=True)
class ProgressSnapshot:
    """Where a run stands, for a progress display."""

    counts: dict[str, int]
    done: int
    planned: int
    in_flight: int
    images: int


class RunControl:
    """Lets another thread (or a signal handler) stop a run gracefully: no new request is sent, requests in
    flight finish and are recorded, the rest are `not_attempted`."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._wake: Callable[[], None] | None = None

    def stop(self, reason: str) -> None:
        self.reason = reason
        if self._wake is not None:
            self._wake()

    def attach(self, wake: Callable[[], None]) -> None:
        """Called by the dispatcher: how to wake it while it waits for a task."""
        self._wake = wake
        if self.reason is not None:
            wake()


class Progress:
    """Counts of finished units for `on_progress`."""

    def __init__(self, planned: int, on_progress: Callable[[ProgressSnapshot], None] | None) -> None:
        self.planned = planned
        self.on_progress = on_progress
        self.counts: Counter[str] = Counter()
        self.images = 0
        self.in_flight = 0

    def report(self) -> None:
        if self.on_progress:
            done = sum(self.counts.values())
            snap = ProgressSnapshot(dict(self.counts), done, self.planned, self.in_flight, self.images)
            self.on_progress(snap)

    def finished(self, ctx: RunContext, unit: Unit) -> None:
        records = ctx.results[unit.index]
        self.counts.update(r.status for r in records)
        self.images += sum(r.images for r in records if r.status == "succeeded")
        self.report()


def dispatch(
    ctx: RunContext,
    units: list[Unit],
    concurrency: int,
    control: RunControl,
    on_progress: Callable[[ProgressSnapshot], None] | None = None,
) -> int:
    """Run every unit, submitted in manifest order; after a halt, the units not yet submitted are recorded
    without sending. Returns the number of tasks submitted."""
    progress = Progress(sum(len(u.requests) for u in units), on_progress)
    todo: list[Unit] = []
    for unit in units:
        if any(ctx.decision(r.idempotency_key) == "send" for r in unit.requests):
            todo.append(unit)
        else:  # done, or left alone: recorded without a task or a request
            ctx.results[unit.index] = run_unit(ctx, unit)
            progress.finished(ctx, unit)
    done_q: queue.Queue[Unit | None] = queue.Queue()
    control.attach(lambda: done_q.put(None))
    pending = iter(todo)
    submitted = 0
    while True:
        if control.reason:
            ctx.stop_dispatch(control.reason)
        while progress.in_flight < concurrency and not ctx.halt.is_set():
            nxt = next(pending, None)
            if nxt is None:
                break
            # No `tags(...)` here: a context manager around each submit serialises dispatch (measured).
            future = generate.submit(ctx, nxt)
            future.add_done_callback(partial(_put, done_q, nxt))
            progress.in_flight += 1
            submitted += 1
        progress.report()
        if progress.in_flight == 0:
            break
        finished = done_q.get()
        if finished is None:  # woken by RunControl.stop: stop submitting, keep waiting for what is in flight
            continue
        progress.in_flight -= 1
        if finished.index not in ctx.results:  # the task itself failed in Prefect, outside our code
            ctx.results[finished.index] = run_unit_safely(ctx, finished)
        progress.finished(ctx, finished)
    for unit in pending:  # only left after a halt: records without sending (run_unit sends nothing now)
        ctx.results[unit.index] = run_unit(ctx, unit)
        progress.finished(ctx, unit)
    return submitted


def _put(q: queue.Queue[Unit | None], unit: Unit, _future: Any) -> None:
    q.put(unit)
