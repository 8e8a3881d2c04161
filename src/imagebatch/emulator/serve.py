"""`serve(settings)`: the emulator served in the foreground until SIGINT or SIGTERM (the `imagebatch
emulator` command's body; its parser, messages and exit codes are `imagebatch.cli.emulator`'s).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from .server import EmulatorServer
from .settings import EmulatorSettings


class CannotServe(Exception):
    """The emulator could not listen, or its server stopped without being asked to."""


def serve(
    settings: EmulatorSettings,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    on_listening: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve `settings` on `host:port` until SIGINT or SIGTERM (or `stop` is set); return then.

    `on_listening(url)` is called once the server accepts connections. Signals are caught only when called
    from the main thread (elsewhere only `stop` ends it); the previous handlers are put back on return.
    Raises `CannotServe` when it cannot listen or the server stops unexpectedly.
    """
    stop = stop or threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, on_signal)

    server = EmulatorServer(settings, host=host, port=port)
    try:
        try:
            server.start()
        except (OSError, RuntimeError) as exc:
            raise CannotServe(f"cannot listen on {host}:{port}: {exc}") from exc
        if on_listening is not None:
            on_listening(server.url)
        while not stop.wait(0.25):
            if not server.running:
                raise CannotServe("the server stopped unexpectedly")
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
