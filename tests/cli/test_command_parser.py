"""`main` parses a command's arguments with that command's parser alone (`build_parser(command)`): the
same parser as the whole one's, and a start that imports no other command's module."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from imagebatch.cli.main import COMMANDS, build_parser


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_the_commands_are_the_whole_parsers_in_its_order() -> None:
    assert list(_commands(build_parser())) == list(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_commands_own_parser_is_the_whole_parsers_for_it(command: str) -> None:
    whole = _commands(build_parser())[command]
    own = _commands(build_parser(command))
    assert list(own) == [command]
    assert own[command].format_help() == whole.format_help()
    assert [(a.dest, a.option_strings, a.default, a.choices) for a in own[command]._actions] == [
        (a.dest, a.option_strings, a.default, a.choices) for a in whole._actions
    ]
    handlers = own[command].get_default("handler"), whole.get_default("handler")
    assert handlers[0].__code__ is handlers[1].__code__  # the same function (or the same lambda's code)


def test_validate_imports_no_other_commands_module(tmp_path: Path) -> None:
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,prompt\na,a red mug\n")
    script = (
        "import json, sys\n"
        "from imagebatch.cli.main import main\n"
        "code = main(['validate', sys.argv[1]])\n"
        "print(json.dumps([code, sorted(m for m in sys.modules if m.startswith('imagebatch.'))]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(manifest)], capture_output=True, text=True, check=True
    )
    code, modules = json.loads(done.stdout.splitlines()[-1])
    assert code == 0
    assert {m for m in modules if m.startswith("imagebatch.cli.")} == {
        "imagebatch.cli.common",
        "imagebatch.cli.flags",
        "imagebatch.cli.main",
        "imagebatch.cli.validate",
    }
    for other in ("imagebatch.emulator.settings", "imagebatch.delivery.convert", "imagebatch.run.limits"):
        assert other not in modules
