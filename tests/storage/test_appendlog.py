"""Reading JSON Lines back (`storage.appendlog.read_jsonl`): garbage and a line torn by a crash skipped."""

from __future__ import annotations

from pathlib import Path

from imagebatch.storage.appendlog import read_jsonl


def test_read_jsonl_skips_garbage_and_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(
        b'{"a": 1}\n'
        b"not json\n"
        b"[1, 2]\n"  # JSON, but not an object
        b"\xff\xfe\n"  # not UTF-8
        b"\n"
        b'{"a": 2}\n'
        b'{"a": 3, "cut sh'  # a write cut short by a crash: no newline
    )
    assert list(read_jsonl(path)) == [{"a": 1}, {"a": 2}]


def test_read_jsonl_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert list(read_jsonl(tmp_path / "nope.jsonl")) == []


def test_read_jsonl_drops_a_complete_object_without_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}')  # the newline itself was not written
    assert list(read_jsonl(path)) == [{"a": 1}]
