"""The manual's reference pages are the code's: docs/reference/*.md equal what docs/gen_reference.py renders
now from the parser and the field table, and that rendering names every command, option and field."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from imagebatch.cli.main import build_parser
from imagebatch.manifest.fields import KNOWN_FIELDS
from imagebatch.manifest.reference import FIELDS

ROOT = Path(__file__).resolve().parents[1]


def load_generator() -> ModuleType:
    """docs/gen_reference.py, imported from its path (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GEN = load_generator()


@pytest.mark.parametrize("page", sorted(GEN.pages()), ids=lambda p: p.name)
def test_the_checked_in_page_is_the_fresh_rendering(page: Path) -> None:
    assert page.exists(), f"{page.relative_to(ROOT)} is missing: run docs/gen_reference.py"
    assert page.read_text() == GEN.pages()[page], (
        f"{page.relative_to(ROOT)} is stale: run docs/gen_reference.py"
    )


def test_the_cli_page_lists_every_option_of_every_command() -> None:
    page = GEN.cli_page(build_parser())
    commands = list(GEN.subcommands(build_parser()))
    assert {name for name, _, _ in commands} >= {"run", "validate", "review", "export", "deploy", "worker"}
    for name, _, parser in commands:
        section = page.split(f"## imagebatch {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}`" in section, f"{option} of imagebatch {name} is not on the page"


def test_every_row_of_the_cli_page_says_its_default() -> None:
    """`(default: X)` where the help says one; else `required`, `off` (a flag) or `none` (not set)."""
    page = GEN.cli_page(build_parser())
    rows = [line.split(" | ") for line in page.splitlines() if line.startswith("| `")]
    assert len(rows) > 100
    empty = [row[0] for row in rows if not row[2].strip()]
    assert not empty, f"rows with no default: {empty}"
    defaults = {row[2] for row in rows}
    assert {"required", "off", "none", "`4`"} <= defaults


def test_a_changed_option_makes_the_page_stale() -> None:
    parser = build_parser()
    run = next(sub for name, _, sub in GEN.subcommands(parser) if name == "run")
    run.add_argument("--brand-new", help="an option added to the code")
    assert "`--brand-new`" in GEN.cli_page(parser)
    assert GEN.cli_page(parser) != GEN.CLI_PAGE.read_text()


def test_check_mode_names_a_stale_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "reference" / "cli.md"
    stale.parent.mkdir()
    stale.write_text("old\n")
    monkeypatch.setattr(GEN, "DOCS", tmp_path)
    monkeypatch.setattr(GEN, "pages", lambda: {stale: "new\n"})
    assert GEN.main(["--check"]) == 1
    assert "reference/cli.md is stale: run docs/gen_reference.py" in capsys.readouterr().err
    assert stale.read_text() == "old\n"
    assert GEN.main([]) == 0
    assert stale.read_text() == "new\n"


def test_the_field_table_describes_exactly_the_checkers_fields() -> None:
    assert tuple(field.name for field in FIELDS) == KNOWN_FIELDS
    page = GEN.fields_page()
    for field in FIELDS:
        assert f"| `{field.name}` | {field.type} |" in page


def test_a_cell_keeps_to_one_line_and_one_cell() -> None:
    assert GEN._cell("N or M | more\nnext `N|P%`") == "N or M \\| more next `N|P%`"
