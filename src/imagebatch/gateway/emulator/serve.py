"""The `imagebatch emulator` command: serve the emulator in the foreground until Ctrl-C or SIGTERM.

The CLI wires it as `add_arguments(subparser)` and `main(args)`; `python -m imagebatch.gateway.emulator`
runs it on its own. Stdout gets exactly one line, `imagebatch emulator listening on <URL>`, once the
server accepts connections; anything else goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import threading
from types import FrameType
from typing import Any

from pydantic import ValidationError

from .server import EmulatorServer
from .settings import EmulatorSettings, FaultConfig, ScriptedFault, parse_rate, parse_script

API_KEY_ENV = "IMAGEBATCH_API_KEY"
DEFAULT_PORT = 8787


def _rate(text: str) -> tuple[str, float]:
    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _script(text: str) -> ScriptedFault:
    try:
        return parse_script(text)
    except (ValueError, ValidationError) as exc:
        raise argparse.ArgumentTypeError(f"bad script {text!r}: {exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the emulator's options to `parser` (a subcommand parser of the `imagebatch` CLI)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT}; 0 picks a free one)"
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"the key clients must send (default: ${API_KEY_ENV}; without either, a throwaway key "
        "is generated and printed on stderr)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of images, answer shapes and faults")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds each generation takes")
    parser.add_argument(
        "--jpeg-rate", type=float, default=0.25, help="fraction of native/chat images sent as JPEG"
    )
    parser.add_argument(
        "--thought-image-rate",
        type=float,
        default=0.3,
        help="fraction of native answers with a thought image",
    )
    parser.add_argument(
        "--max-images-policy",
        choices=("random", "cap"),
        default="random",
        help="images delivered under X-Service-Max-Images: 1..cap (random) or exactly the cap",
    )
    parser.add_argument(
        "--slow-seconds", type=float, default=660.0, help="how long a 'slow' fault waits (default: 660)"
    )
    parser.add_argument(
        "--fault",
        type=_rate,
        action="append",
        default=[],
        metavar="OUTCOME:RATE",
        help="probabilistic fault, repeatable: e.g. 503:0.1, drop:0.05, slow:0.01, no_image:0.1",
    )
    parser.add_argument(
        "--script",
        type=_script,
        action="append",
        default=[],
        metavar="OUTCOMES[@MATCH]",
        help="scripted outcomes of attempts 1, 2, ... of each Idempotency-Key, repeatable: e.g. "
        "503,503 or 429,ok,drop@cat (only keys or prompts containing 'cat')",
    )


def settings_from_args(args: argparse.Namespace, api_key: str) -> EmulatorSettings:
    faults = FaultConfig(rates=dict(args.fault), scripts=list(args.script))
    return EmulatorSettings(
        api_key=api_key,
        seed=args.seed,
        latency=args.latency,
        jpeg_rate=args.jpeg_rate,
        thought_image_rate=args.thought_image_rate,
        max_images_policy=args.max_images_policy,
        slow_seconds=args.slow_seconds,
        faults=faults,
    )


def main(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; return the exit status (0 after a signal, 1 if it cannot serve)."""
    api_key = args.api_key or os.environ.get(API_KEY_ENV)
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

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)

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
                f"imagebatch emulator: no --api-key or ${API_KEY_ENV}; accepting the throwaway key {api_key}",
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="imagebatch emulator", description="Serve the emulated image-generation gateway."
    )
    add_arguments(parser)
    return parser
