"""`imagebatch init [DIR]`: the example manifests and their reference images written into DIR, so that a
wheel installed anywhere reaches a first run in two commands (`imagebatch init demo && imagebatch run
demo/catalog.csv --out demo/out`).

The examples are the repository's manifests/examples, carried in the wheel as the package data
`imagebatch/examples` (pyproject.toml's force-include); from a source checkout (an editable install) they
are read where they are. Only the manifests, the price table and the images are written, never the
folder's README (it speaks of the repository) nor the script that draws the images.

A file already in DIR is never changed: one identical to the example is left as it is (so `init` may be
run again), one that differs stops `init` before it writes anything, naming the file (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from imagebatch.cli.common import command
from imagebatch.run.exit_codes import EXIT_OK, EXIT_USAGE
from imagebatch.words import counted

NOT_WRITTEN = frozenset({"README.md", "make_images.py"})
"""The examples folder's files that are about the repository, not examples."""
SOURCE_EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"


def add_init(sub: Any) -> None:
    parser = command(
        sub,
        "init",
        "write the example manifests and their images into a folder",
        "Then `imagebatch run DIR/catalog.csv --out DIR/out` makes their images on the embedded emulator. "
        "A file already there is never changed.",
    )
    parser.add_argument(
        "dir", nargs="?", default=".", metavar="DIR", help="the folder to write into (default: .)"
    )
    parser.set_defaults(handler=init_command)


def examples() -> Traversable:
    """The example manifests: the package's data in a wheel, the repository's folder in a checkout."""
    packaged = files("imagebatch") / "examples"
    return packaged if packaged.is_dir() else SOURCE_EXAMPLES


def example_files(root: Traversable) -> dict[str, bytes]:
    """Each example file's path under the examples folder (posix) and its bytes."""
    found: dict[str, bytes] = {}
    for entry in root.iterdir():
        if entry.is_dir() and not entry.name.startswith((".", "__")):
            found |= {f"{entry.name}/{name}": data for name, data in example_files(entry).items()}
        elif entry.is_file() and entry.name not in NOT_WRITTEN:
            found[entry.name] = entry.read_bytes()
    return found


def init_command(args: argparse.Namespace) -> int:
    target = Path(args.dir)
    wanted = example_files(examples())
    clashes = [n for n, data in wanted.items() if (target / n).exists() and _differs(target / n, data)]
    if clashes:
        print(
            f"imagebatch init: {target / clashes[0]} exists and is not the example's; nothing was written "
            f"(choose another DIR, or move {counted(len(clashes), 'file')} away)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if target.exists() and not target.is_dir():
        print(f"imagebatch init: {target} is a file, not a folder; nothing was written", file=sys.stderr)
        return EXIT_USAGE
    try:
        written = _write(target, wanted)
    except OSError as exc:  # a folder that cannot be written: what was written is whole, and the example's
        print(f"imagebatch init: cannot write into {target}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{counted(written, 'example file')} written to {target} ({len(wanted) - written} already there)")
    print(f"next: imagebatch run {target / 'catalog.csv'} --out {target / 'out'}")
    return EXIT_OK


def _write(target: Path, wanted: dict[str, bytes]) -> int:
    """Each example file not already in `target`, written; how many were."""
    written = 0
    for name, data in sorted(wanted.items()):
        path = target / name
        if path.exists():
            continue  # identical: left as it is
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written += 1
    return written


def _differs(path: Path, data: bytes) -> bool:
    return not path.is_file() or path.read_bytes() != data
