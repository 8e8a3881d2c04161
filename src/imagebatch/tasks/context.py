"""What the tasks of one run share: the client, the output folder, what earlier runs left, the halt flag,
and each unit's records."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from imagebatch.gateway import GatewayClient
from imagebatch.manifest import Job, PlannedRequest

from .records import storage_message
from .store import KeyState, OutputStore, RequestRecord

Decision = Literal["send", "skip", "carry"]


@dataclass
class Unit:
    """The requests one task sends: one, or the turns of one chain in order."""

    index: int
    """Position in the run's list of units (results are kept in this order)."""
    job: Job
    requests: list[PlannedRequest]

    @property
    def name(self) -> str:
        return f"{self.job.id}#{self.requests[0].request_index}"

    @property
    def is_chain(self) -> bool:
        return bool(self.job.turns)


def group_units(requests: list[PlannedRequest]) -> list[Unit]:
    """One unit per (job, request index): a plain request, or a chain's turns in order."""
    units: dict[tuple[str, int], Unit] = {}
    for req in requests:
        key = (req.job_id, req.request_index)
        if key not in units:
            units[key] = Unit(len(units), req.job, [])
        units[key].requests.append(req)
    return list(units.values())


class RunContext:
    """What every task of one run shares. A plain class, so Prefect does not walk it as task input."""

    def __init__(
        self,
        client: GatewayClient,
        store: OutputStore,
        states: dict[str, KeyState],
        *,
        force: bool = False,
        retry_unknown: bool = False,
        key_source: str = "IMAGEBATCH_API_KEY",
    ) -> None:
        self.client = client
        self.store = store
        self.states = states
        self.force = force
        self.retry_unknown = retry_unknown
        self.key_source = key_source
        """Where the API key came from, for the message of a 401."""
        self.halt = threading.Event()
        self.halt_reason: str | None = None
        self.results: dict[int, list[RequestRecord]] = {}
        """Records of each finished unit, by unit index (tasks return nothing: Prefect keeps results)."""
        self.started_keys: set[str] = set()
        """Keys with an attempt started in this run."""
        store.on_write_error = self._write_failed  # the next request's writes would fail too
        self.rate_limited = 0
        """HTTP 429 answers seen so far (every attempt): dispatch narrows its window on a new one."""
        self.pacer: Pacer | None = None
        """Spaces request starts for `--rpm`."""
        self._count_lock = threading.Lock()

    def saw_429(self) -> None:
        with self._count_lock:
            self.rate_limited += 1

    def _write_failed(self, exc: OSError) -> None:
        self.stop_dispatch(storage_message(self.store.root, exc))

    def stop_dispatch(self, reason: str) -> None:
        if not self.halt.is_set():
            self.halt_reason = reason
            self.halt.set()

    def decision(self, key: str) -> Decision:
        """`send` it, `skip` it (succeeded before), or `carry` its last status (no_image, unknown)."""
        if self.force:
            return "send"
        state = self.states.get(key)
        status = state.status if state else None
        if status == "succeeded":
            return "skip"
        if status == "no_image" or (status == "unknown" and not self.retry_unknown):
            return "carry"
        return "send"


class Pacer:
    """Spaces request starts `interval` seconds apart across every thread of a run (`--rpm N`: 60 / N)."""

    def __init__(
        self,
        interval: float,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self._sleep = sleep
        self._clock = clock
        self._next = -math.inf
        self._lock = threading.Lock()

    def wait(self) -> float:
        """Wait for this start's slot; return the wait."""
        with self._lock:
            now = self._clock()
            slot = max(now, self._next)
            self._next = slot + self.interval
        wait = slot - now
        if wait > 0:
            self._sleep(wait)
        return wait
