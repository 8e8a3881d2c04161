"""The command line's own voice: its version, its help, what a mistyped word gets."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from typing import Any

import pytest

from imagebatch.cli.main import main


def test_version_prints_the_installed_version(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"imagebatch {version('imagebatch')}\n"
    assert version("imagebatch") == "1.0.0"


def test_the_installed_command_prints_its_version() -> None:
    command = [sys.executable, "-m", "imagebatch.cli.main", "--version"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"imagebatch {version('imagebatch')}\n", "")
