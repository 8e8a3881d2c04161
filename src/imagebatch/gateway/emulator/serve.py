"""The `imagebatch emulator` command: serve the emulator in the foreground until Ctrl-C or SIGTERM.

Its options are defined with every other command's in `imagebatch.cli.main`, which calls
`serve(args)`. Stdout gets exactly one line, `imagebatch emulator listening on <URL>`, once the server
accepts connections; anything else goes to stderr.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
import threading
from types import FrameType
from typing import Any

from pydantic import ValidationError

from ..constants import ENV_API_KEY
from ..environment import api_key_from_environment
from .server import EmulatorServer
from .settings import EmulatorSettings, FaultConfig

SETTINGS_OPTIONS = (
    "seed", "latency", "jpeg_rate", "thought_image_rate", "max_images_policy", "slow_seconds", "rpm",
    "max_in_flight",
)  # fmt: skip
"""The options that are `EmulatorSettings` fields of the same name; one not given keeps its default."""


def settings_from_args(args: argparse.Namespace, api_key: str) -> EmulatorSettings:
    faults = FaultConfig(rates=dict(args.fault), scripts=list(args.script))
    given = {name: getattr(args, name) for name in SETTINGS_OPTIONS if getattr(args, name) is not None}
    return EmulatorSettings(api_key=api_key, overload=args.overload_burst, faults=faults, **given)


def serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; return the exit status (0 after a signal, 1 if it cannot serve)."""
    api_key = args.api_key or api_key_from_environment()
    throwaway = not api_key
    if not api_key:
        api_key = secrets.token_urlsafe(24)
    try:
        settings = settings_from_args(args, api_key)
    except ValidationError as exc:
        print(f"imagebatch emulator: invalid options: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, on_signal)

    server = EmulatorServer(settings, host=args.host, port=args.port)
    try:
        try:
            server.start()
        except (OSError, RuntimeError) as exc:
            print(f"imagebatch emulator: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 1
        if throwaway:
            # Only a key generated here is ever printed; a key from the environment or options never is.
            print(
                f"imagebatch emulator: no --api-key or ${ENV_API_KEY}; accepting the throwaway key {api_key}",
                file=sys.stderr,
                flush=True,
            )
        print(f"imagebatch emulator listening on {server.url}", flush=True)
        while not stop.wait(0.25):
            if not server.running:
                print("imagebatch emulator: the server stopped unexpectedly", file=sys.stderr)
                return 1
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
