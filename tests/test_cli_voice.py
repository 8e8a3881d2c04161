"""The command line's own voice: its version, its help, what a mistyped word gets."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from imagebatch.cli.common import EXIT_CODES, default_of, exit_codes_of, parsers, shown_default, with_default
from imagebatch.cli.main import build_parser, main
from imagebatch.run.exit_codes import EXIT_USAGE

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
PROJECT_VERSION = tomllib.loads(PYPROJECT.read_text())["project"]["version"]


def test_version_prints_the_installed_version(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"imagebatch {version('imagebatch')}\n"
    assert version("imagebatch") == PROJECT_VERSION  # pyproject.toml, the one place it is written


def test_the_installed_command_prints_its_version() -> None:
    command = [sys.executable, "-m", "imagebatch.cli.main", "--version"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"imagebatch {version('imagebatch')}\n", "")


def _help_of(argv: list[str], capsys: Any) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return capsys.readouterr().out


def test_a_bare_imagebatch_prints_the_help_and_exits_2(capsys: Any) -> None:
    assert main([]) == EXIT_USAGE
    printed = capsys.readouterr()
    assert printed.out == build_parser().format_help() and printed.err == ""
    assert "commands:" in printed.out and "run " in printed.out


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "m.csv", "--out", "o", "--concurency", "8"], "(did you mean --concurrency?)"),
        (["export", "o", "--to", "d", "--aproved-only"], "(did you mean --approved-only?)"),
        (["review", "o", "--group_by=sku"], "(did you mean --group-by?)"),
        (["valdate", "m.csv"], "(did you mean validate?)"),
        (["run", "m.csv", "--out", "o", "--zzz"], ""),
    ],
)
def test_a_mistyped_option_or_command_gets_the_nearest_one(argv: list[str], said: str, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == EXIT_USAGE
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"imagebatch {argv[0]}: error:" if argv[0] != "valdate" else "imagebatch: error:")
    assert last.endswith(said) and ("did you mean" in last) == bool(said)


def _options() -> list[tuple[str, argparse.Action]]:
    found = []
    for parser in parsers(build_parser()):
        found += [
            (parser.prog, a) for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS
        ]
    return found


def test_every_value_has_a_named_metavar() -> None:
    """A word or a shape in capitals (N, COLUMN, KEY=VALUE, WxH), never argparse's GROUP_BY from the dest."""
    unnamed = [
        f"{prog} {action.option_strings[-1]}"
        for prog, action in _options()
        if action.nargs != 0
        and action.choices is None
        and not (
            isinstance(action.metavar, str) and re.fullmatch(r"[A-Z][A-Za-z:|%=\[\].@]*", action.metavar)
        )
    ]
    assert unnamed == []


def test_every_default_is_written_one_way() -> None:
    """`(default: X)`, and only that: no `(default X)`, no `Default: X.`; a real default is always shown."""
    other = [
        f"{p} {a.option_strings[-1]}"
        for p, a in _options()
        if re.search(r"\(default [^:]|Default:", a.help or "")
    ]
    assert other == []
    unsaid = [
        f"{p} {a.option_strings[-1]}"
        for p, a in _options()
        if shown_default(a) and "(default: " not in a.help
    ]
    assert unsaid == []


def test_the_options_model_writes_each_default(capsys: Any) -> None:
    text = " ".join(_help_of(["run"], capsys).split())
    assert "Requests in flight at once, 1 to 256. (default: 4)" in text
    assert "Space request starts to at most this many a minute. (default: no pacing)" in text
    assert "Regenerate even what is already done. (default: off)" in text
    assert "--max-images N Stop before a request" in text and "(default: none)" in text


@pytest.mark.parametrize(
    ("text", "default", "written"),
    [
        ("Requests at once. (default 4)", None, "Requests at once. (default: 4)"),
        (
            "A table. Default: $PRICES; with neither, none.",
            None,
            "A table. (default: $PRICES; with neither, none)",
        ),
        ("the port", "8787", "the port (default: 8787)"),
        ("the port (default: 0: a free one)", "0", "the port (default: 0: a free one)"),
    ],
)
def test_a_default_is_rewritten_into_the_one_form(text: str, default: str | None, written: str) -> None:
    assert with_default(text, default) == written
    assert default_of(written) == written.split("(default: ", 1)[1][:-1]


def test_each_command_ends_with_its_own_exit_codes(capsys: Any) -> None:
    export, validate = _help_of(["export"], capsys), _help_of(["validate"], capsys)
    assert " ".join(export.split()).endswith(" ".join(exit_codes_of("export").split()))
    assert "2 refused, the rows named (nothing written)" in " ".join(export.split())
    assert "1 some requests did not succeed" not in " ".join(validate.split())
    assert set(EXIT_CODES) == set(subparsers_of(build_parser()))


def subparsers_of(parser: argparse.ArgumentParser) -> list[str]:
    return [n for a in parser._actions if isinstance(a, argparse._SubParsersAction) for n in a.choices]
