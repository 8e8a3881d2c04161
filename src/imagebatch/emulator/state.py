"""The state of one emulator app: settings in force, billing ledger, request log, attempt counters,
signer and render cache. One `EmulatorState` per app (`app.state.emulator`); nothing is module-global.

Handlers run on the server's event loop while tests read from other threads, so every access to the
mutable collections goes through one lock.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from .render import Renderer
from .settings import EmulatorSettings, FaultConfig
from .signing import Signer

ADMIN_PREFIX = "/emulator/"


@dataclass
class RequestLogEntry:
    """One request received on a service path (admin routes are not logged)."""

    seq: int
    time: float
    method: str
    path: str
    request_id: str
    idempotency_key: str | None
    route: str | None = None
    """The `Route` value once the path was recognised; None for unknown paths."""
    model: str | None = None
    attempt: int | None = None
    """Attempt number of this Idempotency-Key; None if the request was refused before that stage."""
    fault: str | None = None
    """The fault outcome applied, if any."""
    status: int | str | None = None
    """HTTP status sent, `drop` for a dropped connection, None while the request is in flight."""
    ended: float | None = None
    """When the answer was sent (or the connection dropped), same clock as `time`; None while in flight."""
    limit: str | None = None
    """`rpm` or `max_in_flight` when a limit refused the request (429); `overload 503` (or 429) in a burst."""
    contents: list[Any] | None = None
    """The native request's `contents` as received, when the setting `log_contents` is on (else None)."""
    answer: dict[str, Any] | None = None
    """The model content the native route answered, signed, when `log_contents` is on (else None)."""
    drop: bool = field(default=False, repr=False)
    holds_slot: bool = field(default=False, repr=False)
    """It counts towards `max_in_flight` until its answer is sent."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["drop"], d["holds_slot"]
        return d


@dataclass(frozen=True)
class LedgerEntry:
    """One billed generation."""

    seq: int
    time: float
    route: str
    model: str
    images: int
    """Final images delivered (or that would have been delivered, for `slow` and `drop`)."""
    usage: dict[str, Any]
    """The usage figures the answer carries (route-specific field names)."""
    idempotency_key: str | None
    request_id: str
    status: int | str
    """HTTP status of the answer, or `drop` when the connection was closed instead."""
    fault: str | None
    attempt: int
    prompt: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EmulatorState:
    """Everything that changes while an emulator app runs."""

    def __init__(self, settings: EmulatorSettings) -> None:
        self.initial_settings = settings
        self.settings = settings
        self.signer = Signer.for_seed(settings.seed, settings.signing_secret)
        self.renderer = Renderer(settings.render_cache_size)
        self._lock = threading.Lock()
        self._ledger: list[LedgerEntry] = []
        self._requests: list[RequestLogEntry] = []
        self._attempts: Counter[str] = Counter()
        self._seq = 0
        self._starts: deque[float] = deque()
        """Clock times of the generations admitted in the last minute (for `rpm`)."""
        self._in_flight = 0

    # --- limits ------------------------------------------------------------------------------------

    def admit(self, record: RequestLogEntry) -> tuple[str, int] | None:
        """Take a generation slot for `record`, or say which limit refuses it and after how many seconds
        to retry. Off unless `rpm` or `max_in_flight` is set."""
        settings = self.settings
        with self._lock:
            now = settings.clock()
            burst = settings.overload
            if burst is not None:
                into = now % burst.every  # periods of the emulator's clock
                if into < burst.length:
                    return f"overload {burst.status}", max(1, math.ceil(burst.length - into))
            while self._starts and self._starts[0] <= now - 60.0:
                self._starts.popleft()
            if settings.max_in_flight is not None and self._in_flight >= settings.max_in_flight:
                return "max_in_flight", 1
            if settings.rpm is not None and len(self._starts) >= settings.rpm:
                return "rpm", max(1, math.ceil(self._starts[0] + 60.0 - now))
            self._starts.append(now)
            self._in_flight += 1
            record.holds_slot = True
            return None

    def release(self, record: RequestLogEntry) -> None:
        """Give back `record`'s slot (its answer was sent, or the connection closed)."""
        with self._lock:
            if record.holds_slot:
                record.holds_slot = False
                self._in_flight -= 1

    @property
    def in_flight(self) -> int:
        return self._in_flight

    # --- configuration ---------------------------------------------------------------------------

    def configure(self, **changes: Any) -> EmulatorSettings:
        """Change settings at runtime (validated); `api_key`, `seed` and `signing_secret` stay fixed."""
        fixed = {"api_key", "seed", "signing_secret"} & changes.keys()
        if fixed:
            raise ValueError(f"cannot change {', '.join(sorted(fixed))} of a running emulator")
        with self._lock:
            merged = {**dict(self.settings), **changes}
            self.settings = EmulatorSettings.model_validate(merged)
            self.renderer.cache_size = self.settings.render_cache_size
            return self.settings

    def set_faults(self, faults: FaultConfig) -> None:
        self.configure(faults=faults)

    def reset(self) -> None:
        """Forget ledger, request log and attempt counters; restore the settings given at startup
        (including its faults, which are none unless the emulator was started with some)."""
        with self._lock:
            self._ledger.clear()
            self._requests.clear()
            self._attempts.clear()
            self._starts.clear()
            self.settings = self.initial_settings
            self.renderer.cache_size = self.settings.render_cache_size

    # --- recording -------------------------------------------------------------------------------

    def open_request(self, method: str, path: str, idempotency_key: str | None) -> RequestLogEntry:
        with self._lock:
            self._seq += 1
            record = RequestLogEntry(
                seq=self._seq, time=time.time(), method=method, path=path,
                request_id=f"req_{uuid.uuid4().hex}", idempotency_key=idempotency_key,
            )  # fmt: skip
            if not path.startswith(ADMIN_PREFIX):
                self._requests.append(record)
            return record

    def next_attempt(self, key: str) -> int:
        with self._lock:
            self._attempts[key] += 1
            return self._attempts[key]

    def bill(self, **fields: Any) -> LedgerEntry:
        with self._lock:
            self._seq += 1
            entry = LedgerEntry(seq=self._seq, time=time.time(), **fields)
            self._ledger.append(entry)
            return entry

    # --- reading ---------------------------------------------------------------------------------

    def ledger(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e.to_dict() for e in self._ledger]

    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.to_dict() for r in self._requests]

    def attempts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._attempts)
