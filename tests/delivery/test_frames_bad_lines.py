"""`imagebatch.results(OUT)` over records with one bad line each (written by the run's own writers, then a
line a person or another tool added): the bad line is left out and counted, the good ones returned; a
record that is not a file (a FIFO) is refused at once, never waited on."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import imagebatch
from imagebatch.delivery.frames import BadRecordsWarning
from imagebatch.storage.bounded import MAX_RECORD_LINE_BYTES, RecordError
from imagebatch.storage.kinds import open_location
from imagebatch.work.decisions import Decision, record_decision
from imagebatch.work.store import OutputStore, RequestRecord


def _row(i: int, **cells: Any) -> dict[str, Any]:
    record = RequestRecord(f"mug-{i}", 0, 0, "succeeded", "compat-image-2", "images", f"key-{i}", images=1)
    return {**record.to_row(), "sku": f"00{i}", **cells}


def _usage(i: int, **fields: Any) -> dict[str, Any]:
    return {
        "idempotency_key": f"key-{i}", "job_id": f"mug-{i}", "request_index": 0, "turn_index": 0,
        "route": "images", "model": "compat-image-2", "attempt": 1, "started_at": "2026-11-28T10:00:00Z",
        "duration_s": 1.5, "http_status": 200, "images": 1, "usage": {"input_tokens": 5}, **fields,
    }  # fmt: skip


def _out(tmp_path: Path, rows: list[dict[str, Any]], usage: list[dict[str, Any]]) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    store = OutputStore(out)
    store.write_results(rows, ["sku"])
    for line in usage:
        store.append_usage(line)
    store.backend.sync()
    return out


def test_a_bad_results_row_is_left_out_and_counted(tmp_path: Path) -> None:
    huge = "x" * 200_000  # over the csv module's field limit (128 KiB)
    rows = [_row(0), _row(1, images="1e30"), _row(2, attempts="three"), _row(3, sku=huge), _row(4)]
    out = _out(tmp_path, rows, [_usage(0)])
    with pytest.warns(BadRecordsWarning, match=r"bad lines left out: 3 of results\.csv"):
        r = imagebatch.results(out)
    assert r.results.job_id.tolist() == ["mug-0", "mug-4"] and str(r.results.images.dtype) == "Int64"
    assert r.skipped == {"results.csv": 3}
    assert len(r.usage) == 1 and r.decisions.empty


def test_bad_usage_lines_are_left_out_and_counted(tmp_path: Path) -> None:
    bad = [
        _usage(1, attempt="three"),
        _usage(2, images=1e30),
        _usage(3, started_at="yesterday"),
        _usage(4, duration_s="slow"),
        _usage(5, usage={"input_tokens": 10**30}),
    ]
    out = _out(tmp_path, [_row(0)], [_usage(0), *bad, _usage(6)])
    with (out / "usage.jsonl").open("ab") as fh:
        fh.write(b"not json\n" + b'{"pad": "' + b"x" * MAX_RECORD_LINE_BYTES + b'"}\n')
        fh.write((json.dumps(_usage(7)) + "\n").encode())
    with pytest.warns(BadRecordsWarning, match=r"7 of usage\.jsonl"):
        r = imagebatch.results(out)
    assert r.usage.idempotency_key.tolist() == ["key-0", "key-6", "key-7"]
    assert str(r.usage.started_at.dt.tz) == "UTC" and r.usage.input_tokens.tolist() == [5, 5, 5]
    assert r.skipped == {"usage.jsonl": 7} and len(r.results) == 1


def test_bad_review_lines_are_left_out_and_counted(tmp_path: Path) -> None:
    out = _out(tmp_path, [_row(0), _row(1), _row(2)], [])
    where = open_location(out)
    record_decision(where, Decision("key-0", 1, "approved", reviewer="ana"))
    record_decision(where, Decision("key-1", 1, "approved", reviewer="ana"))
    lines = [
        {"key": "key-1", "variant": 1, "decision": "rejected", "at": "yesterday"},  # in force, were it good
        {"key": "key-2", "variant": "three", "decision": "approved"},
    ]
    with (out / "review.jsonl").open("a") as fh:
        fh.write("".join(json.dumps(line) + "\n" for line in lines) + "{torn\n")
    record_decision(where, Decision("key-2", 1, "rejected", "chipped", reviewer="bo"))
    with pytest.warns(BadRecordsWarning, match=r"3 of review\.jsonl"):
        r = imagebatch.results(out)
    decisions = r.decisions.set_index("key").decision.to_dict()
    assert decisions == {"key-0": "approved", "key-1": "approved", "key-2": "rejected"}
    assert str(r.decisions["at"].dt.tz) == "UTC"
    assert r.skipped == {"review.jsonl": 3} and len(r.results) == 3


def test_good_records_give_no_warning_and_nothing_skipped(tmp_path: Path, recwarn: Any) -> None:
    r = imagebatch.results(_out(tmp_path, [_row(0)], [_usage(0)]))
    assert r.skipped == {} and not [w for w in recwarn if w.category is BadRecordsWarning]
    assert r.results.images.tolist() == [1] and r.usage.started_at.tolist() == [
        pd.Timestamp("2026-11-28T10:00:00Z")
    ]


@pytest.mark.parametrize("record", ["results.csv", "usage.jsonl", "review.jsonl"])
def test_a_record_that_is_a_fifo_is_refused_at_once(tmp_path: Path, record: str) -> None:
    out = _out(tmp_path, [_row(0)], [_usage(0)])
    (out / record).unlink(missing_ok=True)
    os.mkfifo(out / record)
    got: list[BaseException] = []

    def read() -> None:
        try:
            imagebatch.results(out)
        except RecordError as exc:
            got.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(30)
    assert got, "results() blocked on the FIFO (or did not refuse it)"
    assert str(got[0]) == f"{out / record} is a FIFO, not a file: not read"


def test_run_json_is_read_through_its_model_and_a_refused_one_counted(tmp_path: Path) -> None:
    out = _out(tmp_path, [_row(0)], [_usage(0)])
    OutputStore(out).write_run({"state": "finished", "counts": {"succeeded": 1}, "requests": 1})
    r = imagebatch.results(out)
    assert r.run is not None and (r.run.state, r.run.counts, r.run.schema_version) == (
        "finished", {"succeeded": 1}, 1
    )  # fmt: skip
    assert r.skipped == {}
    (out / "run.json").write_text(json.dumps({"state": "finished", "counts": {"succeeded": "one"}}))
    with pytest.warns(BadRecordsWarning, match="1 of run.json"):
        r = imagebatch.results(out)
    assert r.run is None and r.skipped == {"run.json": 1} and len(r.results) == 1
