"""A count in words, as every message writes one (`words.counted`)."""

from __future__ import annotations

from imagebatch.words import counted


def test_a_count_takes_the_noun_in_its_number() -> None:
    assert [counted(n, "request") for n in (0, 1, 2)] == ["0 requests", "1 request", "2 requests"]
    assert counted(1024, "image name") == "1,024 image names"
