"""The manual's code blocks as a reader meets them: the pages in the order of mkdocs.yml's nav (the README
first), each fenced block with the marker on the line above it, if any, and its commands as argv lists.

    <!-- example: NAME -->        run by the tests (tests/test_docs_journeys.py, tests/test_docs_nightly.py)
    <!-- not run: REASON -->      not run, and why

The generated reference pages (docs/reference/) hold usage synopses, not walkthroughs: they are left out."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(```|~~~)(\w*)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
MARKER = re.compile(r"<!-- (example|not run): (.*) -->")
SHELLS = {"bash", "sh", "shell", "console", "zsh"}
GENERATED = ROOT / "docs" / "reference"


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: where it starts, its language, its marker (`example` or `not run`, with the
    example's name or the reason) and its text."""

    page: str
    line: int
    lang: str
    marker: str | None
    label: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def commands(self) -> list[list[str]]:
        """Each command line as an argv (comments cut, continued lines joined)."""
        lines = self.body.replace("\\\n", " ").splitlines()
        return [argv for argv in (shlex.split(line, comments=True) for line in lines) if argv]


def _nav_pages(nav: list[Any]) -> Iterator[str]:
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            if isinstance(value, list):
                yield from _nav_pages(value)
            else:
                yield str(value)


def pages() -> list[Path]:
    """The README, then the manual's pages in the order a reader follows its nav."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    return [ROOT / "README.md", *(ROOT / "docs" / page for page in _nav_pages(nav))]


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of `page`, in order."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        above = text[: match.start()].rstrip().rpartition("\n")[2]
        marker = MARKER.fullmatch(above)
        found.append(
            Block(
                page=page.relative_to(ROOT).as_posix(),
                line=text.count("\n", 0, match.start()) + 1,
                lang=match.group(2),
                marker=marker.group(1) if marker else None,
                label=marker.group(2).strip() if marker else "",
                body=match.group(3),
            )
        )
    return found


def walkthrough_blocks() -> list[Block]:
    """Every block of every page a reader follows, the generated reference left out."""
    return [b for page in pages() if not page.is_relative_to(GENERATED) for b in blocks(page)]


def examples() -> dict[str, Block]:
    """The blocks marked `<!-- example: NAME -->`, by name, in the reader's order."""
    return {b.label: b for b in walkthrough_blocks() if b.marker == "example"}


def imagebatch_argv(argv: list[str]) -> list[str] | None:
    """`imagebatch`'s own arguments in `uv run [--no-dev] imagebatch ARGS` or `imagebatch ARGS`; else None."""
    if argv[:2] == ["uv", "run"]:
        argv = [a for a in argv[2:] if a != "--no-dev"]
    return argv[1:] if argv[:1] == ["imagebatch"] else None
