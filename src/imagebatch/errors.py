"""The user-facing errors more than one room raises, at the bottom of the layers so that any room can raise
them and the command line alone decides what a user reads and which exit code follows
(`run.exit_codes.code_of`)."""

from __future__ import annotations


class UsageError(Exception):
    """The run (or the command) cannot start as asked: configuration, options, a server or a block that is
    missing; nothing was sent. Its message is the whole line a user reads, naming the option."""
