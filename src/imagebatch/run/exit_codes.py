"""The exit codes of the `imagebatch` command, in one table: the codes, the signal convention, and the
code each user-facing error ends a command with (`code_of`).

The commands in `cli/` choose their code from here, and each command's help ends with its codes written
from these names (`cli.common.EXIT_CODES`); the one other user is the flow's own process, which leaves with
the signal convention when a second signal abandons its requests (`run.graceful_stop.abandon_run`). No
other module names an exit number (tests/test_commands_in_cli.py).
"""

from __future__ import annotations

import signal

from imagebatch.errors import Refusal


def exit_code_for(signum: int) -> int:
    """The conventional code of a process stopped by a signal: 128 + its number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + signum


EXIT_OK = 0
"""Every request succeeded (now or before); a valid manifest; the emulator stopped by a signal."""
EXIT_INCOMPLETE = 1
"""Some requests did not succeed (failed, no_image, unknown, not_attempted) or a record could not be
written; the emulator could not listen; an export's read or write failed midway."""
EXIT_USAGE = 2
"""An invalid manifest or a usage error: nothing was sent (or written, deployed, served)."""
EXIT_INTERRUPTED = exit_code_for(signal.SIGINT)
"""Stopped with Ctrl-C (128 + SIGINT)."""
EXIT_TERMINATED = exit_code_for(signal.SIGTERM)
"""Stopped with SIGTERM (128 + SIGTERM)."""

USAGE_ERRORS: tuple[type[Exception], ...] = (Refusal,)
"""The errors that refuse a command before it does anything (`errors.Refusal`): a usage error, an invalid
manifest, a missing extra."""


def code_of(exc: BaseException) -> int:
    """The code a command ends with when `exc` stops it: a usage error 2, Ctrl-C 130, anything else 1."""
    if isinstance(exc, USAGE_ERRORS):
        return EXIT_USAGE
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_INCOMPLETE
