"""docs/architecture.md's rooms table is generated from the docstrings (docs/gen_architecture.py), and it
names every module under src/ in its room's row, as `name` or `name.py` (a module of a sub-package by its
path in the room: `emulator/app.py`; a package's `__init__` excepted), so that a module added without a
place on the map fails here."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "imagebatch"
DOC = (ROOT / "docs" / "architecture.md").read_text()
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")


def room_row(module: Path) -> str:
    """The rooms table's row of the room `module` is in (`imagebatch.gateway`, `imagebatch.work`, ...)."""
    room = module.relative_to(PACKAGE).with_suffix("").parts[0]
    rows = [line for line in DOC.splitlines() if line.startswith(f"| `imagebatch.{room}` |")]
    assert len(rows) == 1, f"docs/architecture.md has no row for imagebatch.{room}"
    return rows[0]


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_every_module_is_named_in_its_room(module: Path) -> None:
    parts = module.relative_to(PACKAGE).with_suffix("").as_posix().split("/", 1)
    room, name = parts if len(parts) == 2 else (parts[0], parts[0])  # a room that is one module
    assert re.search(rf"`({room}/)?{re.escape(name)}(\.py)?`", room_row(module)), (
        f"docs/architecture.md does not name {module.relative_to(PACKAGE)} in its room's row"
    )


def test_the_rooms_table_is_what_the_docstrings_say() -> None:
    """The table is generated (docs/gen_architecture.py): a docstring changed and not regenerated fails."""
    spec = importlib.util.spec_from_file_location("gen_architecture", ROOT / "docs" / "gen_architecture.py")
    assert spec and spec.loader
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert generator.rendered(DOC) == DOC, "docs/architecture.md is stale: run docs/gen_architecture.py"
    assert generator.main(["--check"]) == 0
    stale = DOC.replace("| `imagebatch.cli` | The", "| `imagebatch.cli` | A stale", 1)
    assert generator.rendered(stale) == DOC
