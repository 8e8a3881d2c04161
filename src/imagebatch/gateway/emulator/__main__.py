"""`python -m imagebatch.gateway.emulator ARGS`: the same as `imagebatch emulator ARGS`."""

from __future__ import annotations

import argparse
import sys

from imagebatch.gateway.emulator.options import emulator_arguments
from imagebatch.gateway.emulator.serve import serve

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m imagebatch.gateway.emulator")
    emulator_arguments(parser)
    sys.exit(serve(parser.parse_args()))
