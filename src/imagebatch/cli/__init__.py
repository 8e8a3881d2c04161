"""The `imagebatch` command: parsing, the terminal's display and exit codes."""

from imagebatch.cli.main import main

__all__ = ["main"]
