"""A bucket's journal read and compacted as streams (`storage.segments`, `ObjectLocation.iter_many`,
`put_stream`, `get_stream`) against a real S3-compatible server (moto): every line back in order, however
the bytes arrive in chunks, the objects outnumber the read window or the compaction outgrows one part."""

from __future__ import annotations

import json
from typing import Any

import pytest

from imagebatch.storage.bounded import MAX_RECORD_LINE_BYTES, RecordError
from imagebatch.storage.objectstore import PART_BYTES, READ_THREADS, ObjectLocation
from imagebatch.storage.segments import JOURNAL, SegmentJournal, read_journal, stream_lines


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_lines_cut_anywhere_by_chunks_come_back_whole_and_numbered(size: int) -> None:
    data = b'{"a":1}\n\n{"b":22}\n{"c":333}'  # an empty line, and a last one without its newline
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    assert list(stream_lines(chunks, "s3://b/j")) == [
        (1, b'{"a":1}'),
        (2, b""),
        (3, b'{"b":22}'),
        (4, b'{"c":333}'),
    ]


def test_a_line_over_the_bound_is_read_past_or_refused_naming_the_object() -> None:
    long = b"x" * (MAX_RECORD_LINE_BYTES + 10)
    chunks = [b"{}\n" + long[:300_000], long[300_000:], b"\n{}\n", long]  # the last one has no newline
    bad: list[int] = []
    assert list(stream_lines(chunks, "s3://b/journal/1.jsonl", bad.append)) == [(1, b"{}"), (3, b"{}")]
    assert bad == [2, 4]
    with pytest.raises(RecordError, match=r"s3://b/journal/1.jsonl has a line over .* \(line 2\)"):
        list(stream_lines(chunks, "s3://b/journal/1.jsonl"))


def test_iter_many_gives_every_object_in_order_beyond_its_window(s3: Any) -> None:
    loc = ObjectLocation(f"s3://{s3.bucket()}/many")
    names = [f"o/{i:03d}" for i in range(READ_THREADS * 3 + 5)]
    for i, name in enumerate(names):
        if i % 7:  # every seventh one never written: None in its place
            loc.put(name, f"{i}".encode())
    got = list(loc.iter_many(names))
    assert got == [None if i % 7 == 0 else f"{i}".encode() for i in range(len(names))]


def _journal(loc: ObjectLocation, run: int, lines: list[dict[str, Any]]) -> SegmentJournal:
    journal = SegmentJournal(loc, run)
    for line in lines:
        journal.append(json.dumps(line).encode() + b"\n", sync=True)  # one segment each
    return journal


def test_a_compaction_larger_than_a_part_keeps_every_line_in_order_and_a_later_one_adds_to_it(
    s3: Any,
) -> None:
    loc = ObjectLocation(f"s3://{s3.bucket()}/big")
    pad = "p" * 200_000
    first = [{"event": "e", "i": i, "pad": pad} for i in range(PART_BYTES // 200_000 + 8)]  # over one part
    journal = _journal(loc, 1, first)
    journal.compact()
    assert loc.list(JOURNAL) == ["journal/00000001-compact.jsonl"]
    assert [line["i"] for line in read_journal(loc)] == list(range(len(first)))
    later = _journal(loc, journal.run, [{"event": "e", "i": len(first) + i} for i in range(3)])
    later.compact()  # the earlier compaction streamed into the new one, then the segments after it
    assert loc.list(JOURNAL) == ["journal/00000002-compact.jsonl"]
    assert [line["i"] for line in read_journal(loc)] == list(range(len(first) + 3))
