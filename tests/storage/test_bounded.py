"""The one reader of OUT's records (`storage.bounded`), attacked: a FIFO in a record's place is refused at
once (never waited on), a link to `/dev/zero` is refused before a byte is read, a line or a record over
its bound is refused (or, with `bad`, skipped and counted) without being held whole; a bucket's object
over the bound is refused from its size alone."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from imagebatch.storage import bounded
from imagebatch.storage.appendlog import read_jsonl
from imagebatch.storage.bounded import (
    MAX_RECORD_LINE_BYTES,
    RecordError,
    open_record,
    read_record,
    record_lines,
    split_lines,
)
from imagebatch.storage.folder import FolderBackend
from imagebatch.storage.objectstore import ObjectLocation


def _in_thread(call: Any) -> BaseException | object:
    """`call()`'s result or exception, from a thread given 20 s: a read that blocks fails the test."""
    box: list[BaseException | object] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:  # handed to the test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(20)
    assert box, "the read blocked"
    return box[0]


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "results.csv"
    os.mkfifo(fifo)
    for read in (open_record, read_record, lambda p: list(record_lines(p)), lambda p: list(read_jsonl(p))):
        got = _in_thread(lambda read=read: read(fifo))
        assert isinstance(got, RecordError)
        assert str(got) == f"{fifo} is a FIFO, not a file: not read"
    got = _in_thread(lambda: FolderBackend(tmp_path).get("results.csv"))
    assert isinstance(got, RecordError) and "FIFO" in str(got)
    got = _in_thread(lambda: FolderBackend(tmp_path).exists("results.csv"))
    assert isinstance(got, RecordError)


def test_a_link_to_a_device_is_refused_before_a_byte_is_read(tmp_path: Path) -> None:
    (tmp_path / "usage.jsonl").symlink_to("/dev/zero")
    with pytest.raises(RecordError, match=r"usage\.jsonl is a character device, not a file: not read"):
        list(read_jsonl(tmp_path / "usage.jsonl"))
    with pytest.raises(RecordError, match="character device"):
        FolderBackend(tmp_path).get("usage.jsonl")


def test_a_fifo_swapped_in_after_the_check_is_caught_on_the_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the check-then-open leaves: the path was a file when checked and is a FIFO when opened;
    the open does not block (O_NONBLOCK) and `fstat` of the descriptor refuses it."""
    record = tmp_path / "journal.jsonl"
    record.write_text("{}\n")
    checked = os.stat(record)
    record.unlink()
    os.mkfifo(record)
    monkeypatch.setattr(bounded.os, "stat", lambda path: checked)  # the check saw the regular file
    got = _in_thread(lambda: open_record(record))
    assert isinstance(got, RecordError) and "FIFO" in str(got)


def test_a_missing_record_is_none_and_a_link_to_a_file_is_read(tmp_path: Path) -> None:
    assert read_record(tmp_path / "run.json") is None and list(record_lines(tmp_path / "x.jsonl")) == []
    (tmp_path / "real.json").write_bytes(b'{"a": 1}')
    (tmp_path / "run.json").symlink_to(tmp_path / "real.json")
    assert read_record(tmp_path / "run.json") == b'{"a": 1}'


def test_a_record_over_its_bound_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_bytes(b"x" * 101)
    assert read_record(path, limit=101) == b"x" * 101
    with pytest.raises(RecordError, match=r"results\.csv is 101 bytes, over the 100 a record is read up to"):
        read_record(path, limit=100)


def test_a_line_over_the_bound_is_refused_or_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    long = b'{"pad": "' + b"x" * MAX_RECORD_LINE_BYTES * 3 + b'"}\n'
    path.write_bytes(b'{"n": 1}\n' + long + b'{"n": 3}\n' + b'{"n": 4, "torn')
    with pytest.raises(RecordError, match=r"journal\.jsonl has a line over 1,048,576 bytes \(line 2\)"):
        list(read_jsonl(path))
    bad: list[int] = []
    assert list(read_jsonl(path, bad.append)) == [{"n": 1}, {"n": 3}]  # the torn last line left out
    assert bad == [2]
    data = path.read_bytes()
    with pytest.raises(RecordError, match="line 2"):
        list(split_lines(data, "s3://b/journal/1.jsonl"))
    assert [n for n, _ in split_lines(data, "s3://b/journal/1.jsonl", bad.append)] == [1, 3, 4]


def test_a_line_not_a_json_object_is_counted_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "usage.jsonl"
    path.write_bytes(b'{"n": 1}\nnot json\n[1, 2]\n{"n": 4}\n')
    assert list(read_jsonl(path)) == [{"n": 1}, {"n": 4}]
    bad: list[int] = []
    assert list(read_jsonl(path, bad.append)) == [{"n": 1}, {"n": 4}] and bad == [2, 3]


def test_a_bucket_object_over_the_bound_is_refused_from_its_size(s3: Any) -> None:
    loc = ObjectLocation(f"s3://{s3.bucket()}/run")
    loc.put("results.csv", b"x" * 2048)
    assert loc.get("results.csv") == b"x" * 2048
    loc.record_limit = 1024
    with pytest.raises(RecordError, match=r"results\.csv is 2,048 bytes, over the 1,024"):
        loc.get("results.csv")


def test_a_small_record_is_read_with_a_buffer_of_its_size_not_of_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`read(limit + 1)` asks the allocator for the whole bound (2 GiB) on every read of run.json: virtual
    memory, which a machine that does not overcommit refuses. The sizes asked of the file are recorded
    (tracemalloc's peak also counts what other threads of the test process allocate meanwhile)."""
    asked: list[int] = []

    class Recording(io.FileIO):
        def read(self, size: int = -1) -> bytes:
            asked.append(size)
            return super().read(size)

    monkeypatch.setattr(bounded, "open_record", lambda p: Recording(p, "rb"))
    path = tmp_path / "run.json"
    path.write_bytes(b'{"state": "succeeded"}')
    assert read_record(path) == b'{"state": "succeeded"}'
    assert asked and all(0 < size <= len(b'{"state": "succeeded"}') + 1 for size in asked), asked


def test_a_record_that_grows_while_it_is_read_is_read_on_up_to_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "run.json"

    class Growing(io.FileIO):
        grown = False

        def read(self, size: int = -1) -> bytes:  # the file grows after its size was taken, before it is read
            if not Growing.grown:
                Growing.grown = True
                with open(path, "ab") as more:
                    more.write(b"y" * 50)
            return super().read(size)

    monkeypatch.setattr(bounded, "open_record", lambda p: Growing(p, "rb"))
    path.write_bytes(b"x" * 10)
    assert read_record(path, limit=200) == b"x" * 10 + b"y" * 50  # read on past the size it had
    Growing.grown = False
    path.write_bytes(b"x" * 10)
    with pytest.raises(RecordError):
        read_record(path, limit=40)  # grown past the bound while read: refused, not cut
