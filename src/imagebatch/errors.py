"""The user-facing errors more than one room raises, at the bottom of the layers so that any room can raise
them and the command line alone decides what a user reads and which exit code follows
(`run.exit_codes.code_of`)."""

from __future__ import annotations


class Refusal(Exception):
    """The base of every error that refuses a command before it does anything (exit 2): `UsageError` here,
    and the rooms' own (`manifest.ManifestError`, `extras.MissingExtra`...), so that the exit code's table
    (`run.exit_codes.code_of`) knows them without importing the rooms that raise them, which a command's
    start would then pay for."""


class UsageError(Refusal):
    """The run (or the command) cannot start as asked: configuration, options, a server or a block that is
    missing; nothing was sent. Its message is the whole line a user reads, naming the option."""
