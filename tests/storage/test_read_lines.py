"""`Backend.read_lines` streams a file of the location line by line, a folder's and a bucket's (moto) alike:
nothing for a file that is not there, a line over the bound refused, and a caller may stop early."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from imagebatch.storage.bounded import MAX_RECORD_LINE_BYTES, RecordError
from imagebatch.storage.kinds import open_location


@pytest.fixture(params=["folder", "bucket"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "folder":
        return str(tmp_path / "out")
    s3: Any = request.getfixturevalue("s3")
    return f"s3://{s3.bucket()}/out"


def test_the_lines_of_a_file_come_one_by_one_without_their_newlines(where: str) -> None:
    backend = open_location(where)
    lines = [b'{"head":1}', *(f'"images/{i}.png"'.encode() for i in range(5000))]
    backend.put("seal.jsonl", b"\n".join(lines) + b"\n")
    assert list(backend.read_lines("seal.jsonl")) == lines
    with contextlib.closing(backend.read_lines("seal.jsonl")) as read:
        assert next(read) == lines[0]  # the rest is never read
    assert list(backend.read_lines("absent.jsonl")) == []


def test_a_line_over_the_bound_is_refused(where: str) -> None:
    backend = open_location(where)
    backend.put("long.jsonl", b"first\n" + b"x" * (MAX_RECORD_LINE_BYTES + 1) + b"\n")
    read = backend.read_lines("long.jsonl")
    assert next(read) == b"first"
    with pytest.raises(RecordError, match=r"long\.jsonl"):
        next(read)
