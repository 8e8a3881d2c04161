"""`imagebatch emulator`: its options, the settings they make, its messages and exit codes; the serving
itself is `imagebatch.emulator.serve`'s.

The settings' defaults are `EmulatorSettings`'s: an option not given is not passed on, so the values are
written once. The parser imports the emulator's settings only (`imagebatch --help` does not load FastAPI:
the package imports its modules when first used). `python -m imagebatch.cli.emulator ARGS` is the same
as `imagebatch emulator ARGS`.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from imagebatch.cli.common import command, defaults_from
from imagebatch.emulator.settings import EmulatorSettings, FaultConfig, parse_bursts, parse_rate, parse_script
from imagebatch.gateway.constants import ENV_API_KEY
from imagebatch.gateway.environment import api_key_from_environment
from imagebatch.run.exit_codes import EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE

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
    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bursts(text: str) -> object:
    try:
        return parse_bursts(text)
    except (ValueError, ValidationError) as exc:
        raise argparse.ArgumentTypeError(f"bad --overload-burst {text!r}: {exc}") from None


def _fault_script(text: str) -> object:
    try:
        return parse_script(text)
    except (ValueError, ValidationError) as exc:
        raise argparse.ArgumentTypeError(f"bad script {text!r}: {exc}") from None


SETTINGS_OPTIONS = (
    "seed", "latency", "jpeg_rate", "thought_image_rate", "max_images_policy", "slow_seconds", "rpm",
    "max_in_flight",
)  # fmt: skip
"""The options that are `EmulatorSettings` fields of the same name; one not given keeps its default."""


def add_emulator(sub: Any) -> None:
    """The `imagebatch emulator` subcommand."""
    parser = command(sub, "emulator", "serve the emulated gateway on loopback", "Until Ctrl-C.")
    emulator_arguments(parser)
    defaults_from(parser, EmulatorSettings)
    parser.set_defaults(handler=run_emulator)


def settings_from_args(args: argparse.Namespace, api_key: str) -> EmulatorSettings:
    faults = FaultConfig(rates=dict(args.fault), scripts=list(args.script))
    given = {name: getattr(args, name) for name in SETTINGS_OPTIONS if getattr(args, name) is not None}
    return EmulatorSettings(api_key=api_key, overload=args.overload_burst, faults=faults, **given)


def run_emulator(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM. Stdout gets exactly one line, `imagebatch emulator listening on
    <URL>`, once the server accepts connections; anything else goes to stderr. Exit 0 after a signal, 1 when
    it cannot listen or its server stops, 2 for options the settings refuse."""
    from imagebatch.emulator.serve import CannotServe, serve

    api_key = args.api_key or api_key_from_environment()
    throwaway = not api_key
    if not api_key:
        api_key = secrets.token_urlsafe(24)
    try:
        settings = settings_from_args(args, api_key)
    except ValidationError as exc:
        # One line naming the option, as every command says a usage error (no pydantic block).
        first = exc.errors(include_url=False)[0]
        option = "--" + "-".join(str(p) for p in first["loc"]).replace("_", "-")
        print(f"imagebatch emulator: invalid option {option}: {first['msg']}", file=sys.stderr)
        return EXIT_USAGE

    def listening(url: str) -> None:
        if throwaway:
            # Only a key generated here is ever printed; a key from the environment or options never is.
            print(
                f"imagebatch emulator: no --api-key or ${ENV_API_KEY}; accepting the throwaway key {api_key}",
                file=sys.stderr,
                flush=True,
            )
        print(f"imagebatch emulator listening on {url}", flush=True)

    try:
        serve(settings, args.host, args.port, on_listening=listening)
    except CannotServe as exc:
        print(f"imagebatch emulator: {exc}", file=sys.stderr)
        return EXIT_INCOMPLETE
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m imagebatch.cli.emulator ARGS`: the command without the rest of `imagebatch`'s parser."""
    parser = argparse.ArgumentParser(prog="python -m imagebatch.cli.emulator")
    emulator_arguments(parser)
    return run_emulator(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
