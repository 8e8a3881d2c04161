"""What the commands' parsers share, so that every help page reads as one voice: the manifest argument,
each command's exit codes (its epilog), a subcommand's parser made with its help as the description a
user reads, and `one_voice`, the pass `build_parser` makes over every option once all are added: a named
metavar for each value (no argparse `GROUP_BY`), one way to write a default, `(default: X)`, filled in from
the option's real default where its help does not say it. `Parser` suggests the nearest option or command
for a mistyped one (argparse's own `suggest_on_error` is Python 3.14's)."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from imagebatch.run.exit_codes import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE

EXIT_CODES: dict[str, tuple[tuple[int | None, str], ...]] = {
    "init": (
        (EXIT_OK, "written (or already there)"),
        (EXIT_USAGE, "a different file in the way or a usage error (nothing written)"),
    ),
    "run": (
        (EXIT_OK, "done"),
        (EXIT_INCOMPLETE, "some requests did not succeed"),
        (EXIT_USAGE, "an invalid manifest or a usage error (nothing sent)"),
        (EXIT_INTERRUPTED, "stopped with Ctrl-C"),
        (EXIT_TERMINATED, "with SIGTERM"),
    ),
    "validate": (
        (EXIT_OK, "valid (the plan printed)"),
        (EXIT_USAGE, "problems found or a usage error; nothing is ever sent"),
    ),
    "emulator": (
        (EXIT_OK, "stopped with Ctrl-C or SIGTERM"),
        (EXIT_INCOMPLETE, "it could not listen or stopped unexpectedly"),
        (EXIT_USAGE, "a usage error (an option out of range: nothing served)"),
    ),
    "report": (
        (EXIT_OK, "written"),
        (EXIT_USAGE, "not an output folder of a finished run, or a usage error"),
    ),
    "review": ((EXIT_OK, "stopped with Ctrl-C"), (EXIT_USAGE, "not an output location or a usage error")),
    "export": (
        (EXIT_OK, "exported"),
        (EXIT_INCOMPLETE, "a read or write failed midway (what was written is whole: run it again)"),
        (EXIT_USAGE, "refused, the rows named (nothing written)"),
        (EXIT_INTERRUPTED, "stopped with Ctrl-C"),
    ),
    "deploy": (
        (EXIT_OK, "deployed (or checked)"),
        (
            EXIT_USAGE,
            "an invalid manifest, a usage error or a refusal of the Prefect server (nothing deployed)",
        ),
    ),
    "serve": (
        (EXIT_OK, "served until stopped"),
        (EXIT_USAGE, "an invalid manifest or a usage error (nothing served)"),
        (EXIT_INTERRUPTED, "stopped with Ctrl-C"),
    ),
    "limits": (
        (EXIT_OK, "created or updated"),
        (EXIT_USAGE, "a usage error or a refusal of the Prefect server"),
    ),
    "worker": (
        (None, "the Prefect worker's own"),
        (EXIT_USAGE, "a usage error"),
        (EXIT_INTERRUPTED, "stopped with Ctrl-C"),
        (EXIT_TERMINATED, "with SIGTERM"),
    ),
}
"""Each command's exit codes (`run.exit_codes`' names) and what each means: the last line of its help
(`exit_codes_of`); None stands for codes that are not imagebatch's own."""
TOP_EXIT_CODES = (
    f"exit codes: {EXIT_OK} done, {EXIT_USAGE} a usage error, nothing done (a bare `imagebatch` prints the "
    f"help and exits {EXIT_USAGE}); each command's own are at the end of its --help"
)


def exit_codes_of(name: str) -> str:
    """The last line of command `name`'s help: `exit codes: 0 ..., 2 ...`, from `EXIT_CODES`."""
    return "exit codes: " + ", ".join(
        text if code is None else f"{code} {text}" for code, text in EXIT_CODES[name]
    )


MANIFEST_HELP = (
    "CSV, JSON, JSON Lines, XLSX (FILE.xlsx#SHEET for a sheet) or Parquet manifest; a CSV or JSON one may "
    "be an object's URL (s3://bucket/m.csv)"
)
OUT_HELP = "an output folder of `imagebatch run`, or its s3://bucket/prefix"

METAVARS = {
    "api_key": "KEY",
    "concurrency": "N",
    "cron": "EXPR",
    "description": "TEXT",
    "grace": "SECONDS",
    "group_by": "COLUMN",
    "host": "ADDRESS",
    "interval": "SECONDS",
    "jpeg_rate": "RATE",
    "latency": "SECONDS",
    "limit": "N",
    "max_in_flight": "N",
    "name": "NAME",
    "out": "OUT",
    "per_minute": "N",
    "pool": "POOL",
    "port": "PORT",
    "reviewer": "NAME",
    "rpm": "N",
    "seed": "N",
    "show": "COLUMNS",
    "slow_seconds": "SECONDS",
    "thought_image_rate": "RATE",
    "timezone": "ZONE",
    "version": "VERSION",
    "work_pool": "POOL",
}
"""The value's name of each option declared without one (by its dest)."""
DEFAULT = "(default: "
"""How every help text writes its default: `(default: X)`."""


def command(sub: Any, name: str, summary: str, details: str = "") -> argparse.ArgumentParser:
    """A subcommand's parser: `summary` in `imagebatch --help`, `summary` and `details` atop its own
    help, its exit codes below it."""
    return sub.add_parser(
        name,
        help=summary,
        description=f"{summary[0].upper()}{summary[1:]}." + (f" {details}" if details else ""),
        epilog=exit_codes_of(name),
    )


def sheet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sheet",
        default=None,
        metavar="NAME",
        help="the sheet of an .xlsx manifest (default: its first visible sheet); the same as FILE.xlsx#NAME",
    )


def with_default(text: str, default: str | None) -> str:
    """`text` ending in `(default: DEFAULT)`; a `Default: X.` sentence of its own (the options model's
    descriptions) or a `(default X)` become that form, so that no help writes a default another way."""
    sentence = re.search(r"\s*\bDefault: (.+?)\.?$", text, re.S)
    if sentence:
        text, default = text[: sentence.start()], sentence.group(1)
    text = re.sub(r"\(default (?=[^:])", DEFAULT, text)
    if default is None or DEFAULT in text:
        return text
    return f"{text.rstrip()} {DEFAULT}{default})"


def default_of(text: str) -> str | None:
    """The X of the `(default: X)` in a help text (parentheses inside X kept), or None."""
    start = text.find(DEFAULT)
    if start < 0:
        return None
    depth, i = 1, start + len(DEFAULT)
    for j in range(i, len(text)):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return text[i:]


def shown_default(action: argparse.Action) -> str | None:
    """An option's real default as its help shows it, or None where there is none to show."""
    value = action.default
    if action.nargs == 0 or action.required or value in (None, argparse.SUPPRESS, False, []):
        return None
    return f"{value:g}" if isinstance(value, float) else str(value)


def defaults_from(parser: argparse.ArgumentParser, model: Any) -> None:
    """The defaults of a pydantic `model` whose fields `parser`'s options set (by dest), written into their
    help where it does not say one: the model is where they are declared."""
    for action in parser._actions:
        field = model.model_fields.get(action.dest)
        if field is None or field.default is None or action.help in (None, argparse.SUPPRESS):
            continue
        default = field.default
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        action.help = with_default(str(action.help), shown)


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """`parser` and every subcommand's parser."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from parsers(sub)


def one_voice(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every option of `parser` and its subcommands: a named metavar and its default written one way."""
    for each in parsers(parser):
        for action in each._actions:
            if not action.option_strings or isinstance(action, argparse._SubParsersAction):
                continue
            if action.nargs != 0 and action.choices is None and action.metavar is None:
                action.metavar = METAVARS.get(action.dest, action.dest.upper())
            if action.help not in (None, argparse.SUPPRESS):
                action.help = with_default(str(action.help), shown_default(action))
    return parser


class Parser(argparse.ArgumentParser):
    """argparse's parser, with a suggestion for a mistyped option or command ("did you mean
    --concurrency?"), taken from this parser's own options and commands."""

    def parse_known_args(  # type: ignore[override]  # typeshed's overloads; the behaviour is argparse's
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and not self._subparsers:  # a command's own parser: its unknown options are errors
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._suggestion(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '([^']*)'", message)
        if choice and "did you mean" not in message:
            choices = [c for a in self._actions if a.choices for c in a.choices]
            message += _nearest(choice.group(1), [str(c) for c in choices])
        super().error(message)

    def _suggestion(self, extras: list[str]) -> str:
        options = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        for word in extras:
            if word.startswith("-"):
                found = _nearest(word.split("=", 1)[0], options)
                if found:
                    return found
        return ""


def _nearest(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
