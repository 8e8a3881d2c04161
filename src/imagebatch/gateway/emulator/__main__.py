"""`python -m imagebatch.gateway.emulator`: the `imagebatch emulator` command without the CLI."""

from __future__ import annotations

import sys

from .serve import build_parser, main

if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
