"""What one run's batches (its Prefect task runs) and request threads share: the client, the output folder,
what earlier runs left, the halt flag, and each unit's records."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from imagebatch.gateway import GatewayClient
from imagebatch.gateway.constants import ENV_API_KEY
from imagebatch.manifest import Job, PlannedRequest
from imagebatch.work.records import storage_message
from imagebatch.work.spool import RecordSpool
from imagebatch.work.store import KeyState, OutputStore

Decision = Literal["send", "skip", "carry"]


@dataclass(slots=True)
class Unit:
    """The requests one task sends: one, or the turns of one chain in order."""

    index: int
    """Position in the run's list of units (results are kept in this order)."""
    job: Job
    requests: list[PlannedRequest]

    @property
    def name(self) -> str:
        first = self.requests[0]
        variant = f" v{first.variant}" if first.variant > 1 else ""
        turn = f" t{first.turn_index}" if variant and first.turn_index else ""
        return f"{self.job.id}#{first.request_index}{turn}{variant}"

    @property
    def is_chain(self) -> bool:
        """The turns of a chain, sent in order (a variant of one turn is a unit of its own, not a chain)."""
        return bool(self.job.turns) and self.requests[0].variant == 1


def group_units(requests: Iterable[PlannedRequest]) -> Iterator[Unit]:
    """One unit per (job, request index, variant), as the requests come: a plain request, or a chain's
    turns in order. A unit's requests are consecutive in a plan (`manifest.plan`), so only the unit being
    filled is held."""
    unit: Unit | None = None
    index = 0
    for req in requests:
        if unit is not None and (req.job_id, req.request_index, req.variant) != _unit_key(unit.requests[0]):
            yield unit
            unit, index = None, index + 1
        if unit is None:
            unit = Unit(index, req.job, [])
        unit.requests.append(req)
    if unit is not None:
        yield unit


def _unit_key(req: PlannedRequest) -> tuple[str, int, int]:
    return req.job_id, req.request_index, req.variant


class StartedKeys:
    """The keys with an attempt started in this run: how many (run.json's `sent`), and which, for the units
    not yet settled only. A settled unit's keys are let go (`release`): a set of every key a run sent grew
    with the run, each key a small string kept among each request's short-lived allocations."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._count = 0
        self._lock = threading.Lock()

    def add(self, key: str) -> None:
        """An attempt of `key` is starting (journaled): counted once, however many attempts it takes."""
        with self._lock:
            if key not in self._keys:
                self._keys.add(key)
                self._count += 1

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        """Keys started in this run, the released ones included."""
        return self._count

    def release(self, keys: Iterable[str]) -> None:
        """Let go of a settled unit's keys (a key belongs to one unit: it is never started again)."""
        with self._lock:
            self._keys.difference_update(keys)


@dataclass(eq=False)
class RunState:
    """What a run's threads change as it sends: the halt, the keys attempted, the 429s seen, each unit's
    records, and `--rpm`'s pacing. Thread-safe where threads share it (`halt`, `saw_429`, `results`)."""

    results: RecordSpool
    """Records of each finished unit, by unit index (tasks return nothing: Prefect keeps results)."""
    pace: Callable[[], object] | None = None
    """Waits for this request's start under `--rpm` (`run.pacing.Pacer.wait`); None: no pacing."""
    halt: threading.Event = field(default_factory=threading.Event)
    halt_reason: str | None = None
    started_keys: StartedKeys = field(default_factory=StartedKeys)
    """Keys with an attempt started in this run (which ones, for units not yet settled)."""
    rate_limited: int = 0
    """HTTP 429 answers seen so far (every attempt): dispatch narrows its window on a new one."""
    _count_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def saw_429(self) -> None:
        with self._count_lock:
            self.rate_limited += 1

    def stop(self, reason: str) -> None:
        """Send nothing more; the first reason given is the run's."""
        if not self.halt.is_set():
            self.halt_reason = reason
            self.halt.set()


@dataclass(frozen=True, eq=False)
class RunContext:
    """What every task of one run shares: its configuration, fixed for the run, and its `state`. Not passed
    to Prefect as a task input (the dispatcher's `RequestThreads` carries it), so Prefect never walks it."""

    client: GatewayClient
    store: OutputStore
    states: Mapping[str, KeyState]
    """The folder's state as the run found it."""
    state: RunState
    force: bool = False
    retry_unknown: bool = False
    held: frozenset[str] = frozenset()
    """Keys this run carries as they stand, whatever their state: variants, outside a `--redo` run."""
    key_source: str = ENV_API_KEY
    """Where the API key came from, for the message of a 401."""
    thumbnails: bool = True
    """Make each image's report thumbnail as it arrives."""

    def decision(self, key: str) -> Decision:
        """`send` it, `skip` it (succeeded before), or `carry` its last status (no_image, unknown)."""
        return decide(self.states.get(key), force=self.force, retry_unknown=self.retry_unknown,
                      held=key in self.held)  # fmt: skip


def sends(unit: Unit, decision: Callable[[str], Decision]) -> bool:
    """Whether a run sends any request of `unit`, by `decision` (`RunContext.decision`, or `decide` over the
    folder's state before the run has a context)."""
    return any(decision(r.idempotency_key) == "send" for r in unit.requests)


def stop_on_write_failure(store: OutputStore, state: RunState) -> None:
    """A failed write to the output location stops the run: the next request's writes would fail too."""
    store.backend.watch.on_error = lambda exc: state.stop(storage_message(store.where, exc))


def decide(
    state: KeyState | None, *, force: bool = False, retry_unknown: bool = False, held: bool = False
) -> Decision:
    """What a run does with a request whose key the journal left in `state` (None: never sent): `send`
    it, `skip` it (succeeded before), or `carry` its last status (no_image; unknown unless
    `retry_unknown`). `--force` sends everything. A `held` key (a variant, outside a `--redo` run:
    `work.variants`) is never sent: anything but a success is carried as it stands. The one rule, for a
    run and for `validate --out`."""
    status = state.status if state else None
    if held:
        return "skip" if status == "succeeded" else "carry"
    if force:
        return "send"
    if status == "succeeded":
        return "skip"
    if status == "no_image" or (status == "unknown" and not retry_unknown):
        return "carry"
    return "send"
