"""What the README and the manual show is true of the code: every `imagebatch ...` command in their code
(blocks and inline spans) names a real subcommand and only options it takes, every link into the
repository of the README and of the repository's other READMEs resolves (the manual's own links are
`mkdocs build --strict`'s), and the README stays a front door: short, with the two quick-start commands as
they are, its links absolute (PyPI shows it outside the repository)."""

from __future__ import annotations

import argparse
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagebatch.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted([README, *(ROOT / "docs").rglob("*.md")])
READMES = [README, *sorted(p for d in ("src", "bench", "manifests") for p in (ROOT / d).rglob("README.md"))]
QUICK_START = (
    "uv run --no-dev imagebatch run manifests/examples/catalog.csv --out out",
    "uv run pytest",
)
MAX_README_LINES = 250

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
COMMAND = re.compile(r"(?:^|(?<=[\s/(]))imagebatch[ \t]+([a-z][a-z-]*)(?![\w.:-])(.*)")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# The README's links into the repository are absolute (PyPI shows it elsewhere): read as the files they name.
REPOSITORY = re.compile(
    r"https://(?:github\.com/imagebatch/imagebatch/(?:blob|tree)|raw\.githubusercontent\.com/imagebatch/imagebatch)/main/"
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("build_parser() has no subcommands")


def code_texts(markdown: str) -> Iterator[str]:
    """The text of each fenced block (its continued lines joined) and of each inline code span."""
    for match in FENCE.finditer(markdown):
        yield from match.group(2).replace("\\\n", " ").splitlines()
    prose = FENCE.sub("", markdown)
    for match in INLINE.finditer(prose):
        yield match.group(1).replace("\n", " ")


def commands(text: str) -> Iterator[tuple[str, list[str]]]:
    """Each `imagebatch SUB ...` in a line of code: its subcommand and the --options it names (up to a
    shell comment, a pipe or `&&`, and never past a bare `--`, after which options are another
    program's)."""
    for match in COMMAND.finditer(text):
        rest = re.split(r"\s#|\s\|\s|&&|;", match.group(2))[0]
        rest = re.split(r"(?:^|\s)--(?:\s|$)", rest)[0]
        yield match.group(1), OPTION.findall(rest)


def problems_in(markdown: str, parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """Every command of `markdown`'s code that the parser would not take, said the way to fix it."""
    found = []
    for text in code_texts(markdown):
        for sub, options in commands(text):
            if sub not in parsers:
                found.append(f"`imagebatch {sub}`: no such command (in: {text.strip()})")
                continue
            known = parsers[sub]._option_string_actions
            found += [
                f"`imagebatch {sub} {o}`: no such option (in: {text.strip()})"
                for o in options
                if o not in known
            ]
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_command_shown_exists(page: Path) -> None:
    assert problems_in(page.read_text(), subparsers()) == []


def test_the_manual_shows_commands_to_check() -> None:
    shown = {sub for page in PAGES for text in code_texts(page.read_text()) for sub, _ in commands(text)}
    assert shown == set(subparsers()), f"commands the manual never shows: {set(subparsers()) - shown}"


def test_a_wrong_command_or_option_is_caught() -> None:
    markdown = (
        "```bash\nuv run imagebatch run m.csv --out out \\\n  --concurency 8   # a typo\n"
        "uv run imagebatch worker --pool p -- --limit 1\n```\n"
        "Inline: `imagebatch deploy M --out O --name N --work-pool P [--cron E | --interval S]`, "
        "`imagebatch validate M --keys --flag`, `imagebatch frobnicate x`.\n"
    )
    assert problems_in(markdown, subparsers()) == [
        "`imagebatch run --concurency`: no such option (in: uv run imagebatch run m.csv --out out    "
        "--concurency 8   # a typo)",
        "`imagebatch validate --flag`: no such option (in: imagebatch validate M --keys --flag)",
        "`imagebatch frobnicate`: no such command (in: imagebatch frobnicate x)",
    ]


# --- the README as a front door ----------------------------------------------------------------------


def test_the_readme_is_short_and_keeps_the_quick_start() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move detail to docs/"
    quick = [line.split("#")[0].strip() for line in lines]
    for command in QUICK_START:
        assert command in quick, f"README.md's quick start lost `{command}`"
    assert "imagebatch/main/docs/report.png)" in README.read_text(), (
        "README.md shows no screenshot of the report"
    )


def test_the_readme_links_absolutely() -> None:
    """PyPI shows the README outside the repository: a relative link would be dead there."""
    links = [m.group(1) or m.group(2) for m in LINK.finditer(FENCE.sub("", README.read_text()))]
    assert links and [link for link in links if not re.match(r"[a-z]+:", link)] == []


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs (Python-Markdown's toc) and GitHub make it, for plain headings."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    markdown = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*$", markdown, re.M)}


def dead_links(page: Path) -> list[str]:
    """The relative links of `page` whose file, or whose anchor in a Markdown file, does not exist."""
    dead = []
    for match in LINK.finditer(FENCE.sub("", page.read_text())):
        target = match.group(1) or match.group(2)
        inside = REPOSITORY.match(target)
        if re.match(r"[a-z]+:", target) and not inside:
            continue  # http:, https:, mailto: elsewhere
        path, _, anchor = target[inside.end() if inside else 0 :].partition("#")
        base = ROOT if inside else page.parent
        resolved = (base / path).resolve() if path else page
        if not resolved.exists():
            dead.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            dead.append(target)
    return dead


@pytest.mark.parametrize("page", READMES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_dead_relative_link(page: Path) -> None:
    assert dead_links(page) == []


def test_a_dead_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A page\n\n## Its part\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#its-part) ![ok](there.md) [web](https://example.com/x)\n"
        "[gone](missing.md) [no anchor](there.md#nowhere) ![no image](shot.png)\n"
        "[in repo](https://github.com/imagebatch/imagebatch/blob/main/README.md#license) "
        "[gone](https://github.com/imagebatch/imagebatch/blob/main/nowhere.md)\n"
    )
    assert dead_links(page) == [
        "missing.md",
        "there.md#nowhere",
        "shot.png",
        "https://github.com/imagebatch/imagebatch/blob/main/nowhere.md",
    ]


def test_the_spec_is_in_the_repository_and_linked_from_inside_it() -> None:
    spec = ROOT / "docs" / "spec" / "service-interface.md"
    assert spec.read_text().startswith("# Image and Text Generation Service: Interface Specification")
    texts = [p.read_text() for p in [*PAGES, *READMES]]
    texts += [p.read_text() for p in (ROOT / "src").rglob("*.py")]
    assert not [t for t in texts if "/work/shared" in t], "a link to the spec points outside the repository"


def test_every_environment_variable_shown_is_read_by_the_code() -> None:
    """An `IMAGEBATCH_*` variable the manual names exists in src/ (or, for a test's own, in tests/)."""
    shown = {v for page in PAGES for v in re.findall(r"IMAGEBATCH_[A-Z_]+", page.read_text())}
    code = " ".join(p.read_text() for d in ("src", "tests") for p in (ROOT / d).rglob("*.py"))
    assert shown and {v for v in shown if v not in code} == set()
