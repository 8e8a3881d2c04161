"""`python -m imagebatch.gateway.emulator ARGS`: the same as `imagebatch emulator ARGS`.

An entry point, not library code: the one command line (`imagebatch.flows.cli`) defines the options."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from imagebatch.flows.cli import main

    sys.exit(main(["emulator", *sys.argv[1:]]))
