"""Prefect is a run's bookkeeping, never its critical path: losing Prefect's server (the temporary one
killed, a real one stopped or unreachable) must not slow sending or stopping.

Prefect's client retries a failed API call five times, 2 + 4 + 8 + 16 + 32 s apart (about a minute a
call), in the calling thread. So:

- Our own calls to Prefect's API (the progress artifact, the run's artifacts, waiting for its task-run
  records) go through `PrefectGuard.later` and `PrefectGuard.call`, on the guard's one thread: the
  dispatcher never waits for them, and the end of the run waits for each at most `CALL_BOUND` seconds.
- A probe asks the server's `/health` every `PROBE_EVERY` seconds; after `MISSES` probes in a row with no
  answer (connection refused: about 3 s after the server dies; no answer within `PROBE_TIMEOUT`: about
  15 s) the server counts as lost for the rest of the run: calls not yet made are dropped, and Prefect's
  own calls (the flow run's final state) are made once each, without retries (`lose`).
- The command (cli.terminal) then prints the run's summary from the records the run wrote
  (`records_written`) even if Prefect's flow engine fails to record the run's end, and says that Prefect's
  record of the run is incomplete; the output folder's records are complete either way.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx

PROBE_EVERY = 1.0
PROBE_TIMEOUT = 5.0
MISSES = 3
CALL_BOUND = 10.0
"""The longest the end of a run waits for one of its own calls to Prefect's API."""

NOTE = "Prefect's record of this run (task runs, artifacts, logs, final state) is incomplete"
"""The start of what the summary and run.json say once Prefect is lost (`PrefectGuard.note`)."""
STOPPED_ANSWERING = "its server stopped answering"


_LOST_HERE = threading.Event()
"""Set once a guard in this process has lost Prefect's server (`lost_in_this_process`)."""


def lost_in_this_process() -> bool:
    """Whether a run in this process lost Prefect's server: Prefect's own exit handlers would then hold
    the process's exit for minutes, its events worker trying each event it still holds (about 7 s an
    event) against a server that is gone (`run.shard_child` exits without them)."""
    return _LOST_HERE.is_set()


class _Call:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.context = contextvars.copy_context()  # the flow run's, so artifacts are attached to it
        self.fn = fn
        self.done = threading.Event()
        self.ok = False


class PrefectGuard:
    """Watches Prefect's API for one run (see the module's docstring). `probe` returns whether the server
    answered (tests pass their own), `every` the seconds between two probes."""

    def __init__(
        self, api_url: str | None = None, probe: Callable[[], bool] | None = None, every: float = PROBE_EVERY
    ) -> None:
        self.api_url = api_url
        self.every = every
        self.probe = probe or self._probe_health
        self.lost = threading.Event()
        self.why: str | None = None
        self.result: dict[str, Any] | None = None
        """The run's summary once its records are written (what the command prints if Prefect fails)."""
        self.written = threading.Event()
        self._save: Callable[[dict[str, Any]], None] | None = None
        self.on_lost: list[Callable[[], None]] = []
        """Called once the server counts as lost (the command silences Prefect's own complaints)."""
        self._settings: Any = None
        self._queue: list[tuple[str | None, _Call]] = []
        self._running: _Call | None = None
        self._cond = threading.Condition()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._health = threading.local()
        """The probing thread's client (`_probe_health`), closed as its watch ends."""

    @property
    def note(self) -> str | None:
        """What to tell the user about Prefect's record of the run: nothing, or that it is incomplete."""
        if not self.lost.is_set():
            return None
        return f"{NOTE}: {self.why}; the output folder's records are complete"

    def start(self) -> PrefectGuard:
        """Start watching, from the flow's thread (its Prefect settings are the ones `lose` changes)."""
        from prefect.settings import PREFECT_API_URL, get_current_settings

        if self._threads:
            return self
        self._closed.clear()
        self.api_url = self.api_url or PREFECT_API_URL.value()
        self._settings = get_current_settings()
        for name, target in (("prefect-calls", self._work), ("prefect-probe", self._watch)):
            thread = threading.Thread(target=target, name=f"imagebatch-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        """Stop the probe and the calls' thread (a call in progress goes on, in the background)."""
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
        self._threads.clear()

    def later(self, key: str, fn: Callable[[], Any]) -> None:
        """Call `fn` on the guard's thread, never waiting for it; a call of the same `key` not yet made is
        replaced (only the latest progress matters)."""
        if self.lost.is_set():
            return
        if not self._threads:  # not watching: a plain call
            self.call(fn)
            return
        with self._cond:
            for replaced in [c for k, c in self._queue if k == key]:
                replaced.done.set()
            self._queue = [(k, c) for k, c in self._queue if k != key]
            self._queue.append((key, _Call(fn)))
            self._cond.notify_all()

    def call(self, fn: Callable[[], Any], bound: float = CALL_BOUND) -> bool:
        """Call `fn` on the guard's thread after the calls before it, waiting at most `bound` seconds (or
        until the server counts as lost); return whether it was made and did not raise."""
        if self.lost.is_set():
            return False
        if not self._threads:  # not watching: a plain call (the caller is not a guarded run)
            with contextlib.suppress(Exception):
                fn()
                return True
            return False
        call = _Call(fn)
        with self._cond:
            self._queue.append((None, call))
            self._cond.notify_all()
        call.done.wait(bound)
        return call.ok

    def records_written(self, info: dict[str, Any], save: Callable[[dict[str, Any]], None]) -> None:
        """The run's records are all written (`save` writes run.json again): what is left is Prefect's
        bookkeeping."""
        self.result, self._save = info, save
        self.written.set()

    def finish(self) -> None:
        """The run has ended: if Prefect's server was lost after run.json was written, say so there too."""
        info, save = self.result, self._save
        if not self.note or info is None or save is None:
            return
        meta = info.setdefault("prefect", {})
        if meta.get("incomplete") != self.note:
            meta["incomplete"] = self.note
            with contextlib.suppress(OSError):
                save(info)

    def lose(self, why: str) -> None:
        """Count the server as lost: drop the calls not made, and make Prefect's own calls fail at once
        instead of retrying for a minute each (the flow run's settings, changed for the rest of the
        process: a run's process ends with it)."""
        if self.lost.is_set():
            return
        self.why = why
        self.lost.set()  # after `why`: `note` reads it
        _LOST_HERE.set()
        with self._cond:
            for _key, call in self._queue:
                call.done.set()
            self._queue.clear()
            if self._running is not None:  # it goes on in the background; nobody waits for it
                self._running.done.set()
            self._cond.notify_all()
        if self._settings is not None:
            with contextlib.suppress(Exception):  # Prefect's settings objects accept assignment
                self._settings.client.max_retries = 0
                self._settings.api.request_timeout = PROBE_TIMEOUT
        for hook in self.on_lost:
            with contextlib.suppress(Exception):
                hook()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed.is_set():
                    self._cond.wait()
                if self._closed.is_set() and not self._queue:
                    return
                _key, call = self._queue.pop(0)
                self._running = call
            try:
                if not self.lost.is_set():
                    call.context.run(call.fn)
                    call.ok = True
            except Exception:  # bookkeeping: a failed call never fails the run
                pass
            finally:
                with self._cond:
                    self._running = None
                call.done.set()

    def _watch(self) -> None:
        misses = 0
        try:
            while not self._closed.wait(self.every) and not self.lost.is_set():
                misses = 0 if self.probe() else misses + 1
                if misses >= MISSES:
                    self.lose(f"{STOPPED_ANSWERING} ({MISSES} health checks of {self.api_url} in a row)")
        finally:
            client: httpx.Client | None = getattr(self._health, "client", None)
            if client is not None:
                client.close()
                del self._health.client

    def _probe_health(self) -> bool:
        """Whether the server answers at all (any HTTP status: an answer is an answer). The probes share
        one client, made on the probing thread: a client made for each probe (`httpx.get`) built a TLS
        context every second, about 50 ms of CPU a probe, a twentieth of a core for as long as a run
        lasts (bench/README.md, "The health probe")."""
        if not self.api_url:
            return True
        client: httpx.Client | None = getattr(self._health, "client", None)
        if client is None:
            client = self._health.client = httpx.Client(timeout=PROBE_TIMEOUT)
        try:
            client.get(f"{self.api_url.rstrip('/')}/health")
        except httpx.HTTPError:
            return False
        return True


_current: contextvars.ContextVar[PrefectGuard | None] = contextvars.ContextVar(
    "imagebatch_prefect_guard", default=None
)


def current() -> PrefectGuard:
    """The guard of the run in this context, or a plain one (not watching: calls are made directly)."""
    return _current.get() or PrefectGuard()


@contextlib.contextmanager
def guarding(guard: PrefectGuard | None = None) -> Iterator[PrefectGuard]:
    """Make `guard` (the command's, else a new one) the current one in this block."""
    guard = guard or _current.get() or PrefectGuard()
    token = _current.set(guard)
    try:
        yield guard
    finally:
        _current.reset(token)


@contextlib.contextmanager
def watching() -> Iterator[PrefectGuard]:
    """Inside a flow run: watch Prefect's API for the run in this block (the command's guard, if it made
    one, so that it knows what happened)."""
    with guarding() as guard:
        guard.start()
        try:
            yield guard
        finally:
            guard.close()
            guard.finish()
