"""The output store's facade over its parts: the journal's appends and group commit, results.csv and the
files, the folder's holds and the shards' merge."""

from __future__ import annotations

import csv
import json
import os
import threading
import time
from pathlib import Path

import pytest
from helpers.records import KEY, OTHER, leftovers, record

from imagebatch.storage import appendlog
from imagebatch.storage.appendlog import read_jsonl
from imagebatch.storage.location import write_atomic
from imagebatch.work.request_record import RESULT_COLUMNS
from imagebatch.work.store import OutputStore


@pytest.fixture
def store(tmp_path: Path) -> OutputStore:
    s = OutputStore(tmp_path / "out")
    s.backend.prepare()
    return s


def test_journal_appends_from_many_threads_stay_whole_lines(store: OutputStore) -> None:
    threads, per_thread = 16, 50
    barrier = threading.Barrier(threads)
    padding = "x" * 3000  # longer than one small write, so interleaving would show

    def worker(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            store.journal("attempt_started", idempotency_key=f"k{t}", attempt=i + 1, pad=padding)
            store.append_usage({"idempotency_key": f"k{t}", "attempt": i + 1, "pad": padding})

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()

    for path in (store.backend.path("journal"), store.backend.path("usage")):
        lines = path.read_bytes().split(b"\n")
        assert lines[-1] == b""
        events = [json.loads(line) for line in lines[:-1]]  # every line is whole JSON
        assert len(events) == threads * per_thread
        for t in range(threads):
            mine = [e["attempt"] for e in events if e["idempotency_key"] == f"k{t}"]
            assert mine == list(range(1, per_thread + 1))  # each thread's lines in its order
    states = store.load_state()
    assert len(states) == threads
    assert all(st.attempts == per_thread and st.status == "unknown" for st in states.values())


def test_write_results_columns_paths_and_empty_values(store: OutputStore) -> None:
    done = record(
        paths=["images/mug_0.png", "images/mug_0_1.png"],
        images=2,
        width=1024,
        height=1024,
        mime_type="image/png",
        attempts=1,
        finish_reason="STOP",
        request_id="req-1",
    )
    unknown = record("unknown", OTHER, error='no answer, "quoted"\nsecond line')
    rows = [
        {"sku": "SKU-1", "colour": "cobalt", "status": "IGNORED", **done.to_row()},
        {"sku": "SKU-2", **unknown.to_row()},  # no colour: empty cell
    ]
    store.write_results(rows, ["sku", "colour", "status"])  # a metadata column named like a result column

    with (store.backend.root / "results.csv").open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
    assert header == [*RESULT_COLUMNS, "sku", "colour"]
    assert header[: len(RESULT_COLUMNS)] == [
        "job_id", "request_index", "turn_index", "variant", "status", "paths", "images", "width", "height",
        "mime_type", "model", "route", "idempotency_key", "attempts", "finish_reason", "error",
        "request_id",
    ]  # fmt: skip

    with (store.backend.root / "results.csv").open(newline="") as fh:
        first, second = csv.DictReader(fh)
    assert first["paths"] == "images/mug_0.png;images/mug_0_1.png"
    assert first["status"] == "succeeded"
    assert (first["width"], first["mime_type"], first["sku"], first["colour"]) == (
        "1024",
        "image/png",
        "SKU-1",
        "cobalt",
    )
    assert first["error"] == ""  # None is an empty cell, not "None"
    assert second["paths"] == "" and second["width"] == "" and second["mime_type"] == ""
    assert second["colour"] == "" and second["sku"] == "SKU-2"
    assert second["error"] == 'no answer, "quoted"\nsecond line'
    assert "None" not in (store.backend.root / "results.csv").read_text()
    assert leftovers(store.backend.root) == []


def test_write_results_rewrites_the_whole_table(store: OutputStore) -> None:
    store.write_results([record().to_row(), record(key=OTHER).to_row()], [])
    store.write_results([record("skipped").to_row()], [])
    with (store.backend.root / "results.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["status"] for r in rows] == ["skipped"]


def test_to_row_has_exactly_the_result_columns() -> None:
    row = record(paths=[], images=0).to_row()
    assert list(row) == list(RESULT_COLUMNS)
    assert row["paths"] == "" and row["width"] == ""


def test_files_and_chains(store: OutputStore) -> None:
    assert store.write_file("mug_0.png", b"\x89PNG") == "images/mug_0.png"
    assert (store.backend.root / "images" / "mug_0.png").read_bytes() == b"\x89PNG"
    assert store.load_chain("mug", 0) is None
    store.save_chain("mug", 0, {"turns": [{"key": KEY}]})
    assert store.load_chain("mug", 0) == {"turns": [{"key": KEY}]}
    store.write_run({"state": "finished", "counts": {"succeeded": 1}})
    written = {"schema_version": 1, "state": "finished", "counts": {"succeeded": 1}}
    assert json.loads((store.backend.root / "run.json").read_text()) == written
    assert leftovers(store.backend.root / "images") == [] and leftovers(store.backend.root / "chains") == []


def test_hold_refuses_a_second_holder_and_releases_after_the_block(tmp_path: Path) -> None:
    from imagebatch.work.store import OutputLockedError

    first, second = OutputStore(tmp_path / "out"), OutputStore(tmp_path / "out")
    with first.backend.hold():
        # flock belongs to the open file description: a second open in this same process conflicts.
        with pytest.raises(OutputLockedError, match="another imagebatch run"):
            with second.backend.hold():
                pytest.fail("the folder was entered twice")
        with pytest.raises(OutputLockedError):
            with first.backend.hold():
                pytest.fail("the folder was entered twice by the same store")
    with second.backend.hold():
        pass

    with pytest.raises(ZeroDivisionError):
        with first.backend.hold():
            1 / 0  # noqa: B018
    with second.backend.hold():  # released when the block raised too
        pass
    assert (tmp_path / "out" / ".imagebatch.lock").is_file()


def test_hold_creates_the_folder(tmp_path: Path) -> None:
    store = OutputStore(tmp_path / "new" / "out")
    with store.backend.hold():
        assert store.backend.root.is_dir()


def test_outputs_are_readable_by_others(store: OutputStore) -> None:
    import stat

    old = os.umask(0o077)  # mkstemp makes 0600 whatever the umask; the store must not keep that
    try:
        write_atomic(store.backend.root / "a.bin", b"x")
        store.write_file("mug/0-0123.png", b"\x89PNG")
        store.save_chain("mug", 0, {"turns": []})
    finally:
        os.umask(old)
    for path in (
        store.backend.root / "a.bin",
        (store.backend.root / "images") / "mug" / "0-0123.png",
        (store.backend.root / store.chain_name("mug", 0)),
    ):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_journal_lines_written_together_share_an_fsync_and_each_returns_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: threads whose lines one fsync covers do not each sync; none returns before an fsync
    that began after its line was written."""
    store = OutputStore(tmp_path)
    store.backend.prepare()
    first_sync = threading.Event()
    lines_at_fsync: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if not lines_at_fsync:  # hold the first fsync until every thread's line is written
            first_sync.wait(timeout=30)
        lines_at_fsync.append(len(store.backend.path("journal").read_bytes().splitlines()))
        real_fsync(fd)

    monkeypatch.setattr(appendlog.os, "fsync", fsync)
    returned: list[int] = []

    def write(i: int) -> None:
        store.journal("attempt_started", idempotency_key=f"k{i}")
        returned.append(lines_at_fsync[-1])  # what the last fsync covered when this call returned

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while store.backend.log.written.get(store.backend.path("journal"), 0) < 8 and time.monotonic() < deadline:
        time.sleep(0.001)  # real threads: wait (bounded) until all eight lines are written
    first_sync.set()
    for t in threads:
        t.join(timeout=30)
    assert len(returned) == 8 and all(n == 8 for n in returned)
    assert len(lines_at_fsync) <= 2  # one fsync (plus at most the first, already begun) for eight lines
    assert len(store.backend.path("journal").read_bytes().splitlines()) == 8


def test_shards_write_their_own_files_and_a_run_holding_the_folder_alone_merges_them(tmp_path: Path) -> None:
    from imagebatch.work.store import OutputLockedError

    one, two = OutputStore(tmp_path, shard="0-of-2"), OutputStore(tmp_path, shard="1-of-2")
    with (
        one.backend.shard_hold(),
        two.backend.shard_hold(),
    ):  # shards share the folder, each holds its own shard
        with pytest.raises(OutputLockedError):
            with OutputStore(tmp_path).backend.hold():  # a run that is not sharded waits for them
                pass
        with pytest.raises(OutputLockedError, match="shard 0-of-2"):
            with OutputStore(tmp_path, shard="0-of-2").backend.shard_hold():  # the same shard twice: never
                pass
        one.record_outcome(record(key=KEY))
        two.record_outcome(record(key=OTHER, status="failed"))
        one.append_usage({"idempotency_key": KEY})
    assert one.backend.path("journal").name == "journal.shard-0-of-2.jsonl"
    plain = OutputStore(tmp_path)
    assert {k: s.status for k, s in plain.load_state().items()} == {KEY: "succeeded", OTHER: "failed"}
    with plain.backend.hold():
        assert not list(tmp_path.glob("*.shard-*.jsonl"))  # merged into the folder's own files
    assert len(list(read_jsonl(plain.backend.path("journal")))) == 2
    assert len(list(read_jsonl(plain.backend.path("usage")))) == 1
    assert {k: s.status for k, s in plain.load_state().items()} == {KEY: "succeeded", OTHER: "failed"}


def test_a_run_json_that_says_running_is_left_alone_while_a_run_holds_the_folder(tmp_path: Path) -> None:
    """Issue 30 item 6: only a reader that can tell (the lock is free) calls a `running` run dead."""
    store = OutputStore(tmp_path / "out")
    store.backend.prepare()
    then, now = "2026-11-27T10:00:00+00:00", "2026-11-27T11:00:00+00:00"
    store.write_run({"state": "running", "started_at": then})
    with store.backend.hold():  # a live run holds it: its run.json is true
        assert OutputStore(tmp_path / "out").settle_dead_run(now) is None
    assert json.loads((tmp_path / "out" / "run.json").read_text())["state"] == "running"
    settled = OutputStore(tmp_path / "out").settle_dead_run(now)
    assert settled is not None and (settled.state, settled.started_at, settled.noticed_at) == (
        "crashed",
        then,
        now,
    )
