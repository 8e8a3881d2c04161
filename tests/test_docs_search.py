"""The manual's search finds the task page first for the words a user types: each task page carries
mkdocs-material's search boost (`search: boost: 2` front matter) and names the word in a heading (the
search index weighs a section's title 1000 times its text, and a page's boost multiplies both), and no
other page is boosted, so a benchmark or the architecture page that names the word too ranks below it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

DOCS = Path(__file__).resolve().parents[1] / "docs"
TASK_PAGES = (
    "getting-started.md", "manifests.md", "output-folder.md", "review-and-delivery.md", "cost.md",
    "prefect/deployments.md", "prefect/workers.md", "prefect/shards.md", "prefect/limits.md",
    "prefect/object-storage.md", "prefect/operations.md",
)  # fmt: skip
"""The pages that answer "how do I ...", each led by its recipe."""
USER_WORDS = {
    "rejected": "review-and-delivery.md",
    "SKU": "manifests.md",
    "excel": "manifests.md",
    "nightly": "prefect/deployments.md",
}
"""A word a user types, and the page search must show first for it."""
FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)


def boost(page: Path) -> float:
    """The page's search boost from its front matter (1 without)."""
    match = FRONT_MATTER.match(page.read_text())
    meta = yaml.safe_load(match.group(1)) if match else {}
    return float(((meta or {}).get("search") or {}).get("boost", 1))


def headings(page: Path) -> list[str]:
    # a shell comment in a code block is no heading
    text = re.sub(r"^(```|~~~).*?^\1", "", page.read_text(), flags=re.M | re.S)
    return re.findall(r"^#{1,6}\s+(.*)$", text, re.M)


def test_the_task_pages_and_only_they_are_boosted() -> None:
    boosted = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if boost(p) != 1}
    assert boosted == set(TASK_PAGES)
    assert {boost(DOCS / page) for page in TASK_PAGES} == {2.0}


@pytest.mark.parametrize(("word", "page"), USER_WORDS.items())
def test_a_users_word_is_in_a_heading_of_its_task_page(word: str, page: str) -> None:
    titles = headings(DOCS / page)
    assert any(word.lower() in title.lower() for title in titles), f"{page}'s headings: {titles}"
