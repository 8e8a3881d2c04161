"""Every test file's name is unique across tests/: the suite's folders are not packages, so pytest imports
each file by its bare name, and a second `test_spool.py` in another folder is refused at collection (the
whole run then fails on one error)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).parent


def test_no_two_test_files_share_a_name() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(str(path.relative_to(TESTS)))
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, twice
