"""Dispatch: which units are sent, how many are in flight, and when to stop admitting more.

At most `concurrency` units are in flight; new ones are admitted as old ones finish, so a 100,000-row
manifest never holds 100,000 futures, and a 401 or 402 (or Ctrl-C, through `RunControl`) stops the run
before the rest is sent. Units are sent in batches, one Prefect task run each (not one per request: the
server's cost per task run capped a run near 50 requests a second); units this run sends nothing for
never reach a task.

How a unit is sent: the flow's part (`Dispatcher`, here) and the task's part (`run.batches.generate`)::

    flow thread: Dispatcher.run         task run: generate(batch, pool)       request threads: RequestThreads
    ---------------------------         -------------------------------       -------------------------------
    for (batch, unit) in _admitted():
      (window, budgets)
      generate.submit(batch) --------->  for unit in batch:  (waits for each
      batch.admit(unit) ---queue--->      admitted unit; ends once closed)
                                          pool.send(unit, task's context) --> run_plain / run_chain: send
                                        wait for its units                      it, its records `settled`
     _admitted: finished.get() <--------------------------------- unit done ---+
      _take: window, budgets, progress
     _admitted: finished.get() <-- task run ended --+
      _take: units it never took (its task run failed in Prefect) -> RequestThreads.send, from here

The dispatcher alone decides what is sent and when; the task only takes what was admitted to its batch and
hands each unit to the run's request threads (`concurrency` of them, shared by every batch, so a batch's
tail never idles a slot) in the task run's context, so that the unit's log lines are the task's.
`RequestThreads.send` is the one call from the task back up into the flow, named as such by the
`RequestPool` protocol of `run.batches`. Records never pass through Prefect: they go to `ctx.state.results`
(a `work.context.RecordSpool`), and the dispatcher learns that a unit finished from its `finished` queue.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import itertools
import queue
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from prefect.futures import PrefectFuture

from imagebatch.run.batches import Batch, batch_size, cut_batches, generate
from imagebatch.work.context import RunContext, Unit, sends
from imagebatch.work.keeping import settled
from imagebatch.work.store import RequestRecord
from imagebatch.work.unit import run_unit, settle, unit_path


@dataclass(frozen=True)
class ProgressSnapshot:
    """Where a run stands, for a progress display."""

    counts: dict[str, int]
    done: int
    planned: int
    in_flight: int
    images: int
    window: int = 0
    """How many units may be in flight now (the adaptive window)."""
    rate_limited: int = 0
    """HTTP 429 answers so far."""


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


class Window:
    """How many units may be in flight: TCP's congestion control applied to a rate-limited service.

    It starts at `start` (not at `--concurrency`: the service's limit is unknown) and grows by one per
    finished unit (doubling each round) until the first 429; then each 429 halves it (once per round:
    the 429s of one overshoot count once) and it grows back by one per two windows of units finished
    without a 429 (additive increase, multiplicative decrease). Never above `limit` nor below 1.
    With `adaptive=False` it stays at `limit` (the benchmark's baseline)."""

    def __init__(self, limit: int, adaptive: bool = True, start: int = 4) -> None:
        self.limit = limit
        self.adaptive = adaptive
        self.size = min(limit, start) if adaptive else limit
        self.threshold = limit
        self._credit = 0
        self._quiet = 0
        """Units still to finish before another 429 may shrink the window again."""

    def finished(self, rate_limited: bool) -> None:
        if not self.adaptive:
            return
        self._quiet = max(0, self._quiet - 1)
        if rate_limited:
            if self._quiet == 0:
                self.threshold = self.size = max(1, self.size // 2)
                self._credit = 0
                self._quiet = self.size * 2  # what was sent before the cut may still come back 429
            return
        if self.size >= self.limit:
            return
        self._credit += 1
        if self.size < self.threshold or self._credit >= 2 * self.size:
            self.size += 1
            self._credit = 0


@dataclass
class Budget:
    """A cap on what this run may deliver (`--max-images`) or spend (`--max-spend`): a unit is not sent if
    what finished units used, plus the most the units in flight can use, plus the most it can use, would
    pass `cap`."""

    name: str
    cap: float
    most: Callable[[Unit], float]
    """The most a unit can use (images at most, or their price)."""
    used: Callable[[Unit, list[RequestRecord]], float]
    """What a finished unit used."""
    show: Callable[[float], str] = str
    spent: float = 0.0
    reserved: dict[int, float] = field(default_factory=dict)

    def reserve(self, unit: Unit) -> str | None:
        """Reserve the most `unit` can use until it finishes; or, if that would pass the cap, reserve
        nothing and return why it is not sent."""
        held = sum(self.reserved.values())
        if self.spent + held + self.most(unit) > self.cap + 1e-9:
            return (
                f"{self.name} {self.show(self.cap)} reached ({self.show(self.spent)} used, "
                f"{self.show(held)} at most in flight); rerun with a higher cap to go on"
            )
        self.reserved[unit.index] = self.most(unit)
        return None

    def finished(self, unit: Unit, records: list[RequestRecord]) -> None:
        self.reserved.pop(unit.index, None)
        self.spent += self.used(unit, records)


TRIM_EVERY = 1000
"""Requests finished between two `release_free_memory` calls."""


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the system (glibc's `malloc_trim`; elsewhere nothing); return
    whether it could. Each request thread frees its answer's megabytes into its own malloc arena, which
    keeps much of it: a 10,000-request run's RSS grew 0.6-0.8 KB a request that a trim gives back
    (bench/README.md "Memory"). A trim costs about a millisecond; the dispatcher asks for one every
    `TRIM_EVERY` requests."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; musl has none
    except (OSError, AttributeError):
        return None


class Progress:
    """Counts of finished units for `on_progress`; frees memory every `TRIM_EVERY` requests."""

    def __init__(self, planned: int, on_progress: Callable[[ProgressSnapshot], None] | None) -> None:
        self.planned = planned
        self.on_progress = on_progress
        self.counts: Counter[str] = Counter()
        self.images = 0
        self.in_flight = 0
        self.window = 0
        self.rate_limited = 0

    def report(self) -> None:
        if self.on_progress:
            done = sum(self.counts.values())
            snap = ProgressSnapshot(
                dict(self.counts), done, self.planned, self.in_flight, self.images,
                self.window, self.rate_limited,
            )  # fmt: skip
            self.on_progress(snap)

    def finished(self, records: list[RequestRecord]) -> None:
        before = self.counts.total()
        self.counts.update(r.status for r in records)
        if before // TRIM_EVERY != self.counts.total() // TRIM_EVERY:
            release_free_memory()
        self.images += sum(r.images for r in records if r.status == "succeeded")
        self.report()


class RequestThreads:
    """The run's request threads (`concurrency` of them, shared by every batch): `run.batches.RequestPool`.

    `send` runs the unit's path (`work.unit.unit_path`) on one of them, its records kept whatever happens
    (`work.keeping.settled`), and puts the unit on the dispatcher's `finished` queue once it is done; the
    task calls it for each unit it takes, the dispatcher for the units no task took."""

    def __init__(self, ctx: RunContext, pool: Executor, finished: queue.Queue[Unit | Batch | None]) -> None:
        self.ctx, self.pool, self.finished = ctx, pool, finished

    def send(self, unit: Unit, context: contextvars.Context | None = None) -> Future[list[RequestRecord]]:
        path = unit_path(unit)
        if context is None:
            future = self.pool.submit(path, self.ctx, unit, settled)
        else:  # the task run's: the unit's log lines are the task's
            future = self.pool.submit(context.run, path, self.ctx, unit, settled)
        future.add_done_callback(partial(_put, self.finished, unit))
        return future

    def records(self, unit: Unit) -> list[RequestRecord]:
        return self.ctx.state.results.get(unit.index, [])


class Dispatcher:
    """Runs every unit, admitted in manifest order, at most `window.size` (at most `concurrency`) at once;
    after a halt, the units not yet admitted are recorded without sending (see the module's picture).

    `units` is the run's plan, iterated once, never held: `to_send` of them are to be sent (the plan's
    count, `run.plan.RunPlan.to_send`), which sizes the batches (`run.batches.batch_size`). The pass
    records each unit this run sends nothing for as it comes, and cuts the units to send into consecutive
    batches (`run.batches.Batch`), one Prefect task run each, as they come: the batch being admitted and
    the next one (started one batch ahead) are all it holds. This thread alone admits units: a unit takes
    one of the run's slots when the window has room, its batch's task is started with its first unit and
    closed after its last, and the unit is sent on the run's `RequestThreads`. So the window, the budgets,
    a halt and Ctrl-C act on single requests, while Prefect's server records one task run per batch.

    `budgets` cap this run (see `Budget`): at the first unit one would refuse, no more is admitted, what
    is in flight finishes, and the run stops there (the rest `not_attempted`, the reason naming the cap);
    a rerun with a higher cap goes on."""

    def __init__(
        self,
        ctx: RunContext,
        units: Iterable[Unit],
        planned: int,
        to_send: int,
        concurrency: int,
        control: RunControl,
        on_progress: Callable[[ProgressSnapshot], None] | None = None,
        adaptive: bool = True,
        budgets: Sequence[Budget] = (),
    ) -> None:
        self.ctx, self.units, self.concurrency, self.control = ctx, units, concurrency, control
        self.to_send = to_send
        self.budgets = budgets
        self.progress = Progress(planned, on_progress)
        self.window = Window(concurrency, adaptive)
        self.seen_429 = 0
        self.capped: str | None = None  # why no more units are admitted (the budget), once they would pass it
        self.finished: queue.Queue[Unit | Batch | None] = queue.Queue()
        """Finished units, ended task runs (their batch), and None for a wake-up by `RunControl.stop`."""
        self.pending: Iterator[tuple[Batch, Unit]] = iter(())
        self.next_batch: Batch | None = None
        """The batch after the one being admitted (its task run is started one batch ahead)."""
        self.open_batches: dict[int, Batch] = {}
        self.started = 0  # task runs started: batches 0 .. started - 1
        self.running: dict[int, PrefectFuture[None]] = {}
        """The task runs not yet ended, by batch. An ended one is dropped: a future keeps its done-callbacks,
        and so its batch and every unit of it, for as long as it is held."""
        self.ended: set[int] = set()  # batches whose task run has ended
        self.threads: RequestThreads  # set by `run`, while its threads exist

    def run(self) -> int:
        """Send what is to be sent; return the number of Prefect task runs (batches) started. Each unit
        `_admitted` lets through goes to its batch's task run, started with its first unit (and the next
        batch's with it), or is sent from here if that task run has already ended."""
        with self._sending():
            for batch, unit in self._admitted():
                if batch.index in self.ended:  # its task run failed in Prefect before its last unit
                    self.threads.send(unit)
                    continue
                # The next batch's task run starts now, one batch ahead: a task run takes tens of ms to
                # start (more on a busy server), and a unit admitted to a batch not yet running waited
                # for it with its slot idle (640 @ 1 s @ 32: a slot idle 24 ms p50, 131 ms p90).
                for starting in (batch, self.next_batch):
                    if starting is None or starting.index < self.started:  # they start in order
                        continue
                    # No `tags(...)` here: a context manager around each submit serialises dispatch.
                    future = generate.submit(starting, self.threads)
                    future.add_done_callback(partial(_put, self.finished, starting))
                    self.open_batches[starting.index] = starting
                    self.running[starting.index] = future
                    self.started += 1
                batch.admit(unit)
                if unit is batch.units[-1]:
                    batch.close()
        return self.started

    @contextlib.contextmanager
    def _sending(self) -> Iterator[None]:
        """The run's request threads, and the units in batches, for `run`; once every admitted unit has
        finished, the open batches closed, their task runs waited for, and the units left after a halt
        recorded here (`run_unit` sends nothing now)."""
        size = batch_size(self.to_send)
        self.control.attach(partial(self.finished.put, None))
        self.pending = self._batched(cut_batches(self._to_send(), size))
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="imagebatch-request") as pool:
            self.threads = RequestThreads(self.ctx, pool, self.finished)
            yield
            for batch in self.open_batches.values():
                batch.close()
        wait_for_tasks(list(self.running.values()))
        for _batch, unit in self.pending:
            self._record_here(unit)

    def _admitted(self) -> Iterator[tuple[Batch, Unit]]:
        """The units to admit, each with its batch, as the window has room and nothing stops the run (a
        halt, Ctrl-C, a budget); between them, what the `finished` queue gives (`_take`), until nothing is
        in flight. Once the run stops, the open batches are closed: admitted units are sent, the rest are
        recorded at the end (`_sending`)."""
        ctx, progress, halt = self.ctx, self.progress, self.ctx.state.halt
        while True:
            if self.control.reason:
                ctx.state.stop(self.control.reason)
            progress.window, progress.rate_limited = self.window.size, ctx.state.rate_limited
            while progress.in_flight < self.window.size and not halt.is_set() and self.capped is None:
                nxt = next(self.pending, None)
                if nxt is None:
                    break
                self.capped = next((why for b in self.budgets if (why := b.reserve(nxt[1]))), None)
                if self.capped is not None:  # not a halt yet: what is already admitted fits, and is sent
                    self.pending = itertools.chain([nxt], self.pending)
                    break
                progress.in_flight += 1
                yield nxt
            if halt.is_set() or self.capped is not None:
                for batch in self.open_batches.values():
                    batch.close()
            progress.report()
            if progress.in_flight == 0:
                if self.capped is not None:  # only now: the rest are recorded not_attempted at the end
                    ctx.state.stop(self.capped)
                return
            self._take(self.finished.get())

    def _to_send(self) -> Iterator[Unit]:
        """The units to send, in order; the others (done, or left alone) recorded as they come, without a
        task or a request."""
        for unit in self.units:
            if sends(unit, self.ctx.decision):
                yield unit
            else:
                self._record_here(unit)

    def _batched(self, batches: Iterator[Batch]) -> Iterator[tuple[Batch, Unit]]:
        """Each unit to send with its batch, the next batch cut before the first unit of one is admitted."""
        batch = next(batches, None)
        while batch is not None:
            self.next_batch = following = next(batches, None)
            for unit in batch.units:
                yield batch, unit
            batch = following

    def _record_here(self, unit: Unit) -> None:
        """Record a unit this run sends nothing for, in this thread, without a task or a request."""
        self.ctx.state.results[unit.index] = records = run_unit(self.ctx, unit)
        self.progress.finished(records)

    def _take(self, finished: Unit | Batch | None) -> None:
        """Act on what the `finished` queue gave: a finished unit, an ended task run, or a wake-up."""
        if finished is None:  # woken by RunControl.stop: stop admitting, wait for what is in flight
            return
        if isinstance(finished, Batch):  # its task run ended: units it never took are sent from here
            self.ended.add(finished.index)
            self.open_batches.pop(finished.index, None)
            self.running.pop(finished.index, None)
            for unit in finished.untaken():
                self.threads.send(unit)
            return
        self.progress.in_flight -= 1
        if finished.index not in self.ctx.state.results:  # the unit's thread died outside our code
            settle(self.ctx, finished)
        records = self.ctx.state.results[finished.index]  # read back once (the spool keeps them on disk)
        for budget in self.budgets:
            budget.finished(finished, records)
        self.window.finished(rate_limited=self.ctx.state.rate_limited > self.seen_429)
        self.seen_429 = self.ctx.state.rate_limited
        self.progress.finished(records)


def wait_for_tasks(futures: list[PrefectFuture[None]]) -> None:
    """Let every batch's task run reach its final state (their units have all finished by now)."""
    for future in futures:
        with contextlib.suppress(Exception):  # the records are ours; a task run's own failure is Prefect's
            future.wait()


def _put(q: queue.Queue[Unit | Batch | None], item: Unit | Batch, _future: object) -> None:
    q.put(item)
