"""Exit codes of the `imagebatch` command (listed in the README and in `imagebatch --help`)."""

EXIT_OK = 0
"""Every request succeeded (now or before); a valid manifest; the emulator stopped by a signal."""
EXIT_INCOMPLETE = 1
"""Some requests did not succeed (failed, no_image, unknown, not_attempted) or a record could not be
written; the emulator could not listen."""
EXIT_USAGE = 2
"""An invalid manifest or a usage error: nothing was sent."""
EXIT_INTERRUPTED = 130
"""Stopped with Ctrl-C (128 + SIGINT); SIGTERM gives 143 (128 + SIGTERM)."""


def exit_code_for(signum: int) -> int:
    """The conventional code of a run stopped by a signal: 128 + its number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + signum


INTERRUPTED = "interrupted"
"""How the stop reason of a run stopped by a signal begins (`interrupted (SIGTERM)`)."""
