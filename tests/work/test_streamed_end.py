"""The end of a run written by streaming: a shard's journal merged into the folder's a batch at a time,
results.csv uploaded to a bucket from a temporary file (moto, a real S3-compatible server), both
whatever their size, every line and row in order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.records import record

from imagebatch.storage import layout
from imagebatch.storage.appendlog import read_jsonl
from imagebatch.storage.folder import MERGE_BATCH_BYTES
from imagebatch.storage.objectstore import PART_BYTES
from imagebatch.work.request_record import RESULT_COLUMNS
from imagebatch.work.store import OutputStore


def test_a_shard_journal_larger_than_a_batch_is_merged_whole_in_order_after_the_folders_own(
    tmp_path: Path,
) -> None:
    (tmp_path / layout.jsonl(layout.JOURNAL)).write_bytes(b'{"event":"x","i":-1}')  # a torn last line
    pad = "p" * 1000
    lines = [{"event": "x", "i": i, "pad": pad} for i in range(MERGE_BATCH_BYTES // 1000 + 500)]
    shard = tmp_path / layout.jsonl(layout.JOURNAL, "0-of-2")
    shard.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines) + b'{"cut')
    store = OutputStore(tmp_path)
    with store.backend.hold():
        assert not shard.exists()
    merged = [line["i"] for line in read_jsonl(store.backend.path("journal"))]
    assert merged == [-1, *range(len(lines))]  # the torn line ended, the shard's own cut line left out


def test_results_csv_larger_than_a_part_reaches_a_bucket_row_by_row_in_order(s3: Any) -> None:
    store = OutputStore(f"s3://{s3.bucket()}/results")
    note = "n" * 900
    count = PART_BYTES // 1000 + 100
    rows = ({"note": f"{i}-{note}", **record(key=f"k{i}").to_row()} for i in range(count))
    with store.backend.hold():
        store.write_results(rows, ["note"])
    got = store.read_results()
    assert got is not None and len(got) == count
    assert list(got[0]) == [*RESULT_COLUMNS, "note"]
    assert [r["idempotency_key"] for r in got[:3]] == ["k0", "k1", "k2"] and got[-1]["note"].startswith(
        f"{count - 1}-"
    )
