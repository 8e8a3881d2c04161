"""`EmulatorServer`: the emulator served by uvicorn in a background thread, for tests, the embedded
default of `imagebatch run`, and the `imagebatch emulator` command.

    with EmulatorServer(EmulatorSettings(api_key="k")) as server:
        httpx.post(server.url + "/v1/images/generations", ...)
        server.ledger()
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any, Self

import uvicorn

from .app import EmulatorApp, create_app
from .settings import EmulatorSettings, FaultConfig, ScriptedFault
from .state import EmulatorState


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
    ) -> None:
        self.settings = settings
        self.host = host
        self.port = port
        self.app: EmulatorApp = create_app(settings)
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
        sock.listen(128)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            # Pinned: dropping a connection reaches into the h11 protocol's transport (see edge.py).
            http="h11",
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
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- addresses -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The service root (`{base_url}` of the spec), e.g. `http://127.0.0.1:54321`."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    base_url = url

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
