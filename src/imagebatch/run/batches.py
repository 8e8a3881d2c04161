"""Batches of units, and the Prefect task that sends one batch; the plain functions it runs are in
`work.unit`.

A unit is one request, or for an edit chain the ordered turns of one request (each turn is its own billed
request with its own key and results row). A batch is consecutive units, one Prefect task run (see
`Batch`). Records go to the run context, never back through Prefect.
"""

from __future__ import annotations

import contextvars
import math
import queue
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, wait
from typing import Any, Protocol

from prefect import task
from prefect.cache_policies import NO_CACHE

from imagebatch.work.context import Unit
from imagebatch.work.outcome import batch_state
from imagebatch.work.store import RequestRecord


class Batch:
    """Consecutive units that one Prefect task run sends: Prefect's server records a task run per batch,
    not per request (each costs it ~30 ms of CPU and ~24 KB of database). The dispatcher admits the
    batch's units one by one, in order, as the run's shared slots free up (`admit`), and closes it when
    it has admitted the last, or when the run stops; the task iterates over what is admitted.

    A plain class (not a dataclass), so Prefect does not walk its units as task inputs."""

    def __init__(self, index: int, units: list[Unit]) -> None:
        self.index = index
        self.units = units
        self._admitted: queue.SimpleQueue[Unit | None] = queue.SimpleQueue()
        self.closed = False

    @property
    def name(self) -> str:
        """The task run's name: its one unit (`job#request`), or the range of units it holds."""
        if len(self.units) == 1:
            return self.units[0].name
        return f"{self.units[0].name} .. {self.units[-1].name} ({len(self.units)})"

    def admit(self, unit: Unit) -> None:
        self._admitted.put(unit)

    def close(self) -> None:
        """No more units will be admitted (the last one was, or the run stopped)."""
        if not self.closed:
            self.closed = True
            self._admitted.put(None)

    def __iter__(self) -> Iterator[Unit]:
        """The admitted units, in order, as they are admitted; ends when the batch is closed."""
        while (unit := self._admitted.get()) is not None:
            yield unit

    def untaken(self) -> list[Unit]:
        """Admitted units nobody took (the task never ran them): the dispatcher sends them itself."""
        left: list[Unit] = []
        while True:
            try:
                unit = self._admitted.get_nowait()
            except queue.Empty:
                return left
            if unit is not None:
                left.append(unit)


def batch_size(units: int) -> int:
    """Units per batch: one task run per unit up to 100 units (every request visible in Prefect's UI), then
    about 100 task runs per run, up to 1,000 units each. Past 100 units the server's cost per request
    falls with the batch: ~30 ms / size of CPU and ~24 KB / size of database (bench/README.md)."""
    return max(1, min(1000, math.ceil(units / 100)))


def cut_batches(units: Iterable[Unit], size: int) -> Iterator[Batch]:
    """`units` cut into consecutive batches of `size` (the last one shorter), each once it is whole."""
    batch: list[Unit] = []
    index = 0
    for unit in units:
        batch.append(unit)
        if len(batch) == size:
            yield Batch(index, batch)
            batch, index = [], index + 1
    if batch:
        yield Batch(index, batch)


class RequestPool(Protocol):
    """The run's request threads, which the flow owns (`run.dispatch.RequestThreads`; the picture of the
    task's part and the flow's part of sending a unit is in `run/dispatch.py`).

    `send` sends the unit on one of them, in `context`, its records kept whatever happens
    (`work.keeping.settled`), and tells the flow's dispatcher once the unit has finished: it is the one
    call from a task back up into the flow."""

    def send(self, unit: Unit, context: contextvars.Context | None = None) -> Future[list[RequestRecord]]: ...

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
    futures: list[Future[list[RequestRecord]]] = []
    for unit in batch:
        ran.append(unit)
        futures.append(pool.send(unit, contextvars.copy_context()))
    wait(futures)
    return batch_state(r for unit in ran for r in pool.records(unit))
