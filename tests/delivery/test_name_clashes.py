"""`nameclashes.NameClashes`: `naming.clashes`' rule found on disk, a batch of names at a time, with the
same pairs in the same order."""

from __future__ import annotations

import pytest

from imagebatch.delivery import nameclashes
from imagebatch.delivery.nameclashes import NameClashes
from imagebatch.delivery.naming import clashes

NAMES = {
    "line 2": "mugs/red.png",
    "line 3": "mugs/Red.png",  # one file on a case-insensitive file system
    "line 4": "mugs",  # a folder of lines 2, 3 and 7
    "line 5": "caf\u00e9.png",
    "line 6": "cafe\u0301.png",  # the same name, decomposed
    "line 7": "mugs/blue/1.png",
    "line 8": "MUGS/blue",  # a folder of line 7
    "line 9": "plates/white.png",
    "line 10": "mugs/red.png",
    "line 11": "plates/white.png/x.png",  # under a name that is a file
}


@pytest.mark.parametrize("batch", [2, 3, 5000])
def test_the_pairs_are_those_of_naming_clashes_in_its_order(
    monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    monkeypatch.setattr(nameclashes, "BATCH", batch)
    with NameClashes() as names:
        for label, name in NAMES.items():
            names.add(label, name)
        found = list(names.found())

    assert found == clashes(NAMES)
    assert found[:3] == [
        ("line 2", "line 3", "mugs/Red.png"),
        ("line 5", "line 6", "cafe\u0301.png"),
        ("line 2", "line 10", "mugs/red.png"),
    ]
    assert ("line 4", "line 7", "mugs/blue/1.png") in found and (
        "line 8",
        "line 7",
        "mugs/blue/1.png",
    ) in found
    assert ("line 9", "line 11", "plates/white.png/x.png") in found


def test_unique_names_clash_with_nothing() -> None:
    with NameClashes() as names:
        for i in range(12_000):  # more than a batch
            names.add(f"line {i}", f"sku-{i}/front.png")
        assert list(names.found()) == []
