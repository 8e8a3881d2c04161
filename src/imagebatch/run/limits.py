"""The account-wide limit: one service account is shared by every run and every machine, so each request
takes a slot of a Prefect global concurrency limit while it is on the wire (never while it waits out a
retry's backoff), and, when one is set, a slot of a rate limit (requests a minute, through Prefect's slot
decay). Prefect's server keeps the count for every run, every worker and every machine; a run passes its
slots from one of its requests to the next without asking the server each time (`SlotBroker`).
 `imagebatch limits` (`platform.limits`) sets the limits
on the server; a run takes them with `--global-limit NAME` (or a deployment's `global_limit`).

`NAME` is the concurrency limit; `NAME-per-minute` the rate limit (limit M, decaying M/60 slots a second:
bursts of up to M, then M a minute). Without `--global-limit` a run's own `--concurrency` is its only limit,
as on Prefect's temporary server, which holds no limits.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from imagebatch.errors import UsageError

logger = logging.getLogger(__name__)

DEFAULT_LIMIT = "imagebatch-requests"
SLOT_LEASE_SECONDS = 300
"""A slot's lease, renewed while its request runs; a killed run's slots come back after it."""
REUSE_SECONDS = 30
"""How long a lease may pass from one request of a run to the next before it goes back to the server."""
LINGER_SECONDS = 0.25
"""How long a lease no request of the run holds waits for the run's next request before it goes back."""


def rate_limit_name(name: str) -> str:
    return f"{name}-per-minute"


def rate_limit_of(name: str) -> str | None:
    """The name of the global limit `name`'s rate limit, `NAME-per-minute`, when the server has one.
    Refuses (`UsageError`) a limit the server does not have: a run would otherwise go unlimited without
    a word."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            raise UsageError(
                f"Prefect's server has no global concurrency limit {name!r}: create it with "
                f"`imagebatch limits --name {name} --concurrency N` (a temporary server holds none)"
            ) from None
        try:
            client.read_global_concurrency_limit_by_name(rate_limit_name(name))
        except ObjectNotFound:
            return None
    return rate_limit_name(name)


@dataclass(slots=True, eq=False)  # each lease is itself (hashed by identity)
class _Lease:
    id: UUID
    taken: float
    """When the server granted it (`clock`): a lease is passed on between requests only while younger
    than `reuse_seconds`."""
    renewed: float


@dataclass(slots=True)
class _Waiter:
    ready: threading.Event = field(default_factory=threading.Event)
    lease: _Lease | None = None
    error: BaseException | None = None


class SlotBroker:
    """One run's slots of the account-wide limit `name`: each attempt holds one while it is on the wire.

    Prefect's `concurrency()` costs about 60 ms of the run's CPU a slot (a client, a lease-renewal thread
    and events each time) and capped a run near 2.7 requests a second; each slot the server grants costs
    it 10-20 ms of CPU (an increment and a decrement, bench/README.md "Global concurrency limit"). So:

    - one lease per slot, granted by Prefect's server (`increment-with-lease`) and asked for by one thread
      of the run (on 423, again after the server's `Retry-After`, or as soon as this run gives one back);
      the run's calls to the server go one at a time;
    - an attempt that ends passes its lease on to an attempt of this run that waits for one, without the
      server; with none waiting, the lease waits `linger_seconds` (0.25 s) for the run's next attempt
      (the gap between one unit's end and the next unit's start) before it goes back to the server. So a
      slot is held with nothing on the wire for at most `linger_seconds` (a retry's backoff, 3-15 s, holds
      none);
    - a lease older than `reuse_seconds` goes back to the server when its attempt ends, so every slot
      returns to the server at least that often, where other runs waiting for the limit can take it;
    - the leases held are renewed once half a lease has passed (an attempt may outlast a lease); a killed
      run's slots come back when their leases end, `lease_seconds` after the last renewal.

    With `rate` (`NAME-per-minute`), each attempt first takes a slot of it (Prefect's slot decay), one
    attempt of the run asking at a time. Use it as a context manager (its Prefect client and its keeper
    thread) and pass it as the `slot` of a `GatewayClient`: calling it gives what an attempt holds.
    """

    def __init__(
        self,
        name: str,
        rate: str | None = None,
        *,
        lease_seconds: float = SLOT_LEASE_SECONDS,
        reuse_seconds: float = REUSE_SECONDS,
        linger_seconds: float = LINGER_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        keeper: bool = True,
    ) -> None:
        self.name, self.rate = name, rate
        self.keeper = keeper
        """Whether a thread calls `tend` every `linger_seconds` (tests with a clock of their own call it)."""
        self.lease_seconds = lease_seconds
        self.reuse_seconds = reuse_seconds
        self.linger_seconds = linger_seconds
        self.clock = clock
        self.granted = 0
        """Leases the server granted that an attempt of this run took (granted + passed_on = slots taken)."""
        self.passed_on = 0
        """Leases an attempt took from another attempt of this run, without the server."""
        self._lock = threading.Lock()
        self._waiting: deque[_Waiter] = deque()
        self._idle: deque[tuple[_Lease, float]] = deque()
        self._held: set[_Lease] = set()
        self._asking = False
        self._given_back = threading.Event()
        self._rate_lock = threading.Lock()
        self._server = threading.Lock()
        """Held around each call to Prefect's server: one at a time from a run (on SQLite, an increment
        beside a release of the same run took 1.8 s, against 10 ms one after the other)."""
        self._closed = threading.Event()
        self._client: Any = None
        self._keeper: threading.Thread | None = None
        self._asker: threading.Thread | None = None

    def __enter__(self) -> SlotBroker:
        from prefect.client.orchestration import get_client

        self._client = get_client(sync_client=True)
        self._client.__enter__()
        if self.keeper:
            self._keeper = threading.Thread(target=self._keep, name="imagebatch-slot-keeper", daemon=True)
            self._keeper.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._given_back.set()
        for thread in (self._keeper, self._asker):
            if thread is not None:  # the asker may be idling a lease granted as its waiter left
                thread.join()
        with self._lock:
            idle, self._idle = self._idle, deque()
        for lease, _since in idle:
            self._release(lease)
        self._client.__exit__(None, None, None)

    @contextmanager
    def __call__(self) -> Iterator[None]:
        if self.rate is not None:
            self._take_rate()
        lease = self._take()
        try:
            yield
        finally:
            self._give(lease)

    def _fresh(self, lease: _Lease, now: float) -> bool:
        return now - lease.taken < self.reuse_seconds

    def _take(self) -> _Lease:
        waiter = _Waiter()
        with self._lock:
            now = self.clock()
            stale: list[tuple[_Lease, float]] = []  # the keeper gives these back
            while self._idle:
                lease, _since = self._idle.pop()
                if self._fresh(lease, now):
                    self._idle.extendleft(stale)
                    self.passed_on += 1
                    self._held.add(lease)
                    return lease
                stale.append((lease, -math.inf))
            self._idle.extendleft(stale)
            self._waiting.append(waiter)
            if not self._asking:
                self._asking = True
                self._asker = threading.Thread(target=self._ask_loop, name="imagebatch-slots", daemon=True)
                self._asker.start()
        waiter.ready.wait()
        if waiter.error is not None:
            raise waiter.error
        assert waiter.lease is not None
        return waiter.lease

    def _give(self, lease: _Lease) -> None:
        with self._lock:
            self._held.discard(lease)
            now = self.clock()
            if self._fresh(lease, now):
                if self._waiting:
                    self.passed_on += 1
                    self._hand(self._waiting.popleft(), lease)
                else:
                    self._idle.append((lease, now))
                return
        self._release(lease)
        self._given_back.set()

    def _hand(self, waiter: _Waiter, lease: _Lease) -> None:
        """Under the lock."""
        self._held.add(lease)
        waiter.lease = lease
        waiter.ready.set()

    def _release(self, lease: _Lease) -> None:
        try:
            with self._server:
                self._client.release_concurrency_slots_with_lease(lease.id)
        except Exception as exc:  # the server ends the lease by itself, `lease_seconds` after its renewal
            logger.warning(
                "could not give back a slot of %s (%s); it comes back when its lease ends", self.name, exc
            )

    def _ask_loop(self) -> None:
        """Ask the server for a lease while anyone waits; one such thread at a time."""
        import httpx

        while True:
            with self._lock:
                if not self._waiting:
                    self._asking = False
                    return
            self._given_back.clear()
            if self._closed.is_set():
                return
            try:
                with self._server:
                    response = self._client.increment_concurrency_slots_with_lease(
                        names=[self.name], slots=1, mode="concurrency", lease_duration=self.lease_seconds
                    )
                answer, now = response.json(), self.clock()
                lease = _Lease(UUID(answer["lease_id"]), now, now)
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code == 423:  # every slot taken: ask again later
                    self._given_back.wait(_retry_after(exc.response))
                    continue
                self._fail_waiting(exc)
                return
            except Exception as exc:  # whatever it is, the waiting requests hear of it (none waits forever)
                self._fail_waiting(exc)
                return
            if not answer.get("limits"):  # the limit was deleted: the server grants a slot of nothing
                self._release(lease)
                gone = UsageError(
                    f"Prefect's server no longer has the global concurrency limit {self.name!r}"
                )
                self._fail_waiting(gone)
                return
            with self._lock:
                if self._waiting:
                    self.granted += 1
                    self._hand(self._waiting.popleft(), lease)
                else:  # its waiter had one passed on meanwhile
                    self._idle.append((lease, now))

    def _fail_waiting(self, exc: BaseException) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, deque()
            self._asking = False
        for waiter in waiting:
            waiter.error = exc
            waiter.ready.set()

    def _take_rate(self) -> None:
        import httpx

        with self._rate_lock:
            while True:
                try:
                    with self._server:
                        self._client.increment_concurrency_slots(
                            names=[self.rate], slots=1, mode="rate_limit"
                        )
                    return
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code != 423:
                        raise
                    self._closed.wait(_retry_after(exc.response))

    def tend(self) -> tuple[int, int]:
        """Give back the leases idle for `linger_seconds` (or past `reuse_seconds`), and renew the leases
        held whose last renewal is older than half a lease; return how many of each. The keeper thread
        calls it every `linger_seconds`."""
        now = self.clock()
        with self._lock:
            done = [
                (lease, since)
                for lease, since in self._idle
                if now - since >= self.linger_seconds or not self._fresh(lease, now)
            ]
            for item in done:
                self._idle.remove(item)
            due = [lease for lease in self._held if now - lease.renewed >= self.lease_seconds / 2]
        for lease, _since in done:
            self._release(lease)
        if done:
            self._given_back.set()
        for lease in due:
            try:
                with self._server:
                    self._client.renew_concurrency_lease(lease_id=lease.id, lease_duration=self.lease_seconds)
                lease.renewed = now
            except Exception as exc:
                logger.warning("could not renew a slot's lease of %s (%s)", self.name, exc)
        return len(done), len(due)

    def _keep(self) -> None:
        while not self._closed.wait(self.linger_seconds):
            self.tend()


def _retry_after(response: Any) -> float:
    try:
        return min(max(float(response.headers.get("Retry-After", 1.0)), 0.05), 30.0)
    except ValueError:
        return 1.0
