"""`EmulatorServer`: the emulator served by uvicorn in a background thread, for tests, the embedded
default of `imagebatch run`, and the `imagebatch emulator` command.

    with EmulatorServer(EmulatorSettings(api_key="k")) as server:
        httpx.post(server.url + "/v1/images/generations", ...)
        server.ledger()
"""

from __future__ import annotations

import resource
import socket
import threading
import time
from types import TracebackType
from typing import Any, Self

import uvicorn

from .app import EmulatorApp, create_app
from .guard import limited_protocol
from .settings import EmulatorSettings, FaultConfig, ScriptedFault, ServerLimits
from .state import EmulatorState

LISTEN_BACKLOG = 1024
"""Connections the kernel queues until the server accepts them."""
ACCEPT_BATCH = 64
"""Connections asyncio accepts at once (its `backlog`): under a flood about four batches are accepted
and not yet counted or closed, each holding a file descriptor."""


def _within_descriptors(limits: ServerLimits) -> ServerLimits:
    """`limits` with `max_connections` at most half of (the process's file-descriptor limit - 64 - four
    accept batches): then the cap's connections, as many refused ones lingering (guard.py), the batches
    in flight and 64 others fit, so a connection over the cap is answered 503 instead of failing to be
    accepted ("Too many open files")."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = (soft - 64 - 4 * ACCEPT_BATCH) // 2
    if soft == resource.RLIM_INFINITY or limits.max_connections <= room:
        return limits
    return limits.model_copy(update={"max_connections": max(1, room)})


class EmulatorServer:
    """Runs one emulator app on `host:port` (port 0: a free port) in a daemon thread.

    The helpers (`ledger`, `requests`, `set_faults`, `configure`, `reset`) act on the app's state
    directly; they do what the `/emulator/...` admin routes do, without an HTTP round trip.
    """

    def __init__(
        self,
        settings: EmulatorSettings,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        limits: ServerLimits | None = None,
    ) -> None:
        self.settings = settings
        self.limits = _within_descriptors(limits or ServerLimits())
        """The server's bounds (body size, timeouts, connections); README "Limits"."""
        self.host = host
        self.port = port
        self.app: EmulatorApp = create_app(settings, self.limits)
        self._log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> Self:
        """Bind, serve in a thread, and return once the server accepts connections."""
        if self._thread is not None:
            raise RuntimeError("emulator server already started")
        # Binding here rather than in uvicorn tells us the port at once, and a bind error is raised
        # in the caller's thread instead of ending uvicorn's thread with sys.exit.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto must be IPPROTO_TCP (not 0): asyncio only sets TCP_NODELAY on accepted sockets whose
        # proto says TCP, and without it every keep-alive answer waits 40 ms for a delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        sock.listen(LISTEN_BACKLOG)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            # h11, pinned: dropping a connection reaches into its transport (see edge.py), and the
            # connection cap and header timeout extend it (guard.py).
            http=limited_protocol(self.limits),
            h11_max_incomplete_event_size=self.limits.max_header_bytes,
            timeout_keep_alive=self.limits.idle_timeout,  # type: ignore[arg-type]  # uvicorn uses call_later: a float works
            backlog=ACCEPT_BATCH,
            loop="asyncio",
            lifespan="off",
            log_level=self._log_level,
            log_config=None,  # leave the process's logging configuration alone
            access_log=False,
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=5,
        )
        server = uvicorn.Server(config)
        # Off the main thread uvicorn installs no signal handlers (Server.capture_signals), so the
        # caller keeps control of Ctrl-C and SIGTERM.
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="emulator", daemon=True)
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("emulator server did not start")
            time.sleep(0.005)
        # asyncio listened again with its accept batch as the backlog; the kernel's queue is longer.
        sock.listen(LISTEN_BACKLOG)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to shut down and wait for its thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._server, self._thread = None, None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def open_connections(self) -> int:
        """Connections open now (refused ones still closing included)."""
        return len(self._server.server_state.connections) if self._server is not None else 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- addresses -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The service root (`{base_url}` of the spec), e.g. `http://127.0.0.1:54321`."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def api_key(self) -> str:
        return self.settings.api_key

    # --- state ---------------------------------------------------------------------------------

    @property
    def state(self) -> EmulatorState:
        return self.app.emulator

    def ledger(self, idempotency_key: str | None = None) -> list[dict[str, Any]]:
        """Billed generations (see `LedgerEntry` for the fields), oldest first."""
        entries = self.state.ledger()
        if idempotency_key is not None:
            entries = [e for e in entries if e["idempotency_key"] == idempotency_key]
        return entries

    def requests(self) -> list[dict[str, Any]]:
        """Every request received on a service path (see `RequestLogEntry`), oldest first."""
        return self.state.requests()

    def attempts(self) -> dict[str, int]:
        return self.state.attempts()

    def set_faults(
        self,
        faults: FaultConfig | dict[str, Any] | None = None,
        *,
        rates: dict[str | int, float] | None = None,
        scripts: list[ScriptedFault | dict[str, Any] | list[str | int]] | None = None,
    ) -> FaultConfig:
        """Replace the faults. Either a `FaultConfig` (or its dict), or `rates=` / `scripts=`, where a
        script may be written as just its outcome list: `set_faults(scripts=[[503, 503]])`."""
        if faults is None:
            script_list = [{"outcomes": s} if isinstance(s, list) else s for s in scripts or []]
            faults = {"rates": rates or {}, "scripts": script_list}
        config = faults if isinstance(faults, FaultConfig) else FaultConfig.model_validate(faults)
        self.state.set_faults(config)
        return config

    def configure(self, **changes: Any) -> EmulatorSettings:
        """Change settings at runtime, e.g. `configure(jpeg_rate=1.0, max_images_policy="cap")`."""
        return self.state.configure(**changes)

    def reset(self) -> None:
        """Clear ledger, request log and attempt counters; restore the settings given at construction."""
        self.state.reset()
