"""The options of `imagebatch emulator` (and `python -m imagebatch.gateway.emulator`), in one place.

The settings' defaults are `EmulatorSettings`'s: an option not given is not passed on, so the values are
written once, and the parser imports the settings only to parse a value.
"""

from __future__ import annotations

import argparse

from imagebatch.gateway.constants import ENV_API_KEY

PORT = 8787
"""Where `imagebatch emulator` listens by default."""


def emulator_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=PORT, help=f"port (default: {PORT}; 0 picks a free one)")
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"the key clients must send (default: ${ENV_API_KEY}; without either, a throwaway key "
        "is generated and printed on stderr)",
    )
    # The settings' defaults are `EmulatorSettings`'s (an option not given is not passed on): the parser
    # does not import the emulator, and the values are written once.
    parser.add_argument("--seed", type=int, help="seed of images, answer shapes and faults")
    parser.add_argument("--latency", type=float, help="seconds each generation takes")
    parser.add_argument("--jpeg-rate", type=float, help="fraction of native/chat images sent as JPEG")
    parser.add_argument(
        "--thought-image-rate", type=float, help="fraction of native answers with a thought image"
    )
    parser.add_argument(
        "--max-images-policy",
        choices=("random", "cap"),
        help="images delivered under X-Service-Max-Images: 1..cap (random, the default) or exactly the cap",
    )
    parser.add_argument(
        "--slow-seconds", type=float, help="how long a 'slow' fault waits (default: past the spec's timeout)"
    )
    parser.add_argument("--rpm", type=int, help="rate limit: generations started per minute (default: none)")
    parser.add_argument(
        "--max-in-flight", type=int, help="concurrency limit: generations at once (default: none)"
    )
    parser.add_argument(
        "--overload-burst",
        type=_bursts,
        default=None,
        metavar="EVERY:LENGTH[:STATUS]",
        help="for LENGTH s of every EVERY s refuse generations with STATUS (503 or 429) and Retry-After",
    )
    parser.add_argument(
        "--fault",
        type=_fault_rate,
        action="append",
        default=[],
        metavar="OUTCOME:RATE",
        help="probabilistic fault, repeatable: e.g. 503:0.1, drop:0.05, slow:0.01, no_image:0.1",
    )
    parser.add_argument(
        "--script",
        type=_fault_script,
        action="append",
        default=[],
        metavar="OUTCOMES[@MATCH]",
        help="scripted outcomes of attempts 1, 2, ... of each Idempotency-Key, repeatable: e.g. "
        "503,503 or 429,ok,drop@cat (only keys or prompts containing 'cat')",
    )


def _fault_rate(text: str) -> tuple[str, float]:
    from imagebatch.gateway.emulator.settings import parse_rate

    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bursts(text: str) -> object:
    from pydantic import ValidationError

    from imagebatch.gateway.emulator.settings import parse_bursts

    try:
        return parse_bursts(text)
    except (ValueError, ValidationError) as exc:
        raise argparse.ArgumentTypeError(f"bad --overload-burst {text!r}: {exc}") from None


def _fault_script(text: str) -> object:
    from pydantic import ValidationError

    from imagebatch.gateway.emulator.settings import parse_script

    try:
        return parse_script(text)
    except (ValueError, ValidationError) as exc:
        raise argparse.ArgumentTypeError(f"bad script {text!r}: {exc}") from None
