"""The output folder's store: atomic writes, the journal's replay into key states, results.csv."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from imagebatch.storage import appendlog
from imagebatch.work.store import RESULT_COLUMNS, OutputStore, RequestRecord, read_jsonl, write_atomic

KEY = "ib1-0123456789abcdef0123456789abcdef"
OTHER = "ib1-fedcba9876543210fedcba9876543210"


def record(status: str = "succeeded", key: str = KEY, **fields: Any) -> RequestRecord:
    return RequestRecord(
        job_id="mug",
        request_index=0,
        turn_index=0,
        status=status,  # type: ignore[arg-type]
        model="native-image-2.1",
        route="native",
        idempotency_key=key,
        **fields,
    )


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# --- write_atomic ----------------------------------------------------------------------------------------


def test_write_atomic_replaces_the_whole_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.bin"
    write_atomic(path, b"a much longer first version of the file")
    write_atomic(path, b"short")
    assert path.read_bytes() == b"short"
    assert leftovers(path.parent) == []
    assert [p.name for p in path.parent.iterdir()] == ["a.bin"]


def test_write_atomic_failure_keeps_the_old_file_and_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")

    def broken_replace(src: Any, dst: Any) -> None:
        assert Path(src).exists()  # the temporary file was written, next to the target
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert leftovers(tmp_path) == []
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_write_atomic_interrupted_mid_write_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.bin"

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, b"new")
    assert list(tmp_path.iterdir()) == []


# --- read_jsonl ------------------------------------------------------------------------------------------


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


# --- load_state ------------------------------------------------------------------------------------------


def started(store: OutputStore, key: str = KEY, attempt: int = 1) -> None:
    store.journal("attempt_started", idempotency_key=key, attempt=attempt)


def finished(store: OutputStore, status: int | None, outcome: str, key: str = KEY, attempt: int = 1) -> None:
    store.journal("attempt_finished", idempotency_key=key, attempt=attempt, status=status, outcome=outcome)


@pytest.fixture
def store(tmp_path: Path) -> OutputStore:
    s = OutputStore(tmp_path / "out")
    s.prepare()
    return s


def test_no_journal_means_no_state(store: OutputStore) -> None:
    assert store.load_state() == {}


def test_started_only_is_unknown(store: OutputStore) -> None:
    started(store)
    st = store.load_state()[KEY]
    assert st.status == "unknown" and st.pending and st.attempts == 1


def test_no_answer_is_unknown(store: OutputStore) -> None:
    started(store)
    finished(store, None, "no_answer")
    assert store.load_state()[KEY].status == "unknown"


def test_not_sent_is_failed(store: OutputStore) -> None:
    started(store)
    finished(store, None, "not_sent")  # the connection was never made: nothing can have been billed
    assert store.load_state()[KEY].status == "failed"


def test_error_status_without_outcome_is_failed(store: OutputStore) -> None:
    started(store)
    finished(store, 503, "error")
    st = store.load_state()[KEY]
    assert st.status == "failed" and not st.pending and st.outcome is None


def test_ok_answer_without_outcome_is_unknown(store: OutputStore) -> None:
    # Billed, but the process died before the files and the outcome were saved.
    started(store)
    finished(store, 200, "ok")
    st = store.load_state()[KEY]
    assert st.status == "unknown" and st.answered_ok


def test_retries_then_outcome(store: OutputStore) -> None:
    for attempt, status in enumerate([503, 429], start=1):
        started(store, attempt=attempt)
        finished(store, status, "error", attempt=attempt)
    started(store, attempt=3)
    finished(store, 200, "ok", attempt=3)
    store.write_file("mug_0.png", b"\x89PNG")  # a succeeded outcome counts only while its files exist
    store.record_outcome(record(paths=["images/mug_0.png"], images=1, attempts=3))
    st = store.load_state()[KEY]
    assert st.status == "succeeded" and st.attempts == 3
    assert st.outcome is not None and st.outcome.paths == ["images/mug_0.png"]
    assert st.outcome.attempts == 3 and st.outcome.images == 1


@pytest.mark.parametrize("status", ["succeeded", "no_image", "failed", "unknown"])
def test_outcome_status_is_the_state(store: OutputStore, status: str) -> None:
    started(store)
    finished(store, 200, "ok")
    store.record_outcome(record(status))
    assert store.load_state()[KEY].status == status


def test_a_later_attempt_after_an_outcome(store: OutputStore) -> None:
    started(store)
    finished(store, 503, "error")
    store.record_outcome(record("failed", error="503"))
    assert store.load_state()[KEY].status == "failed"

    # The next run resends it: started and no answer yet -> unknown again; the new send supersedes the
    # old outcome (it no longer describes the request).
    started(store)
    st = store.load_state()[KEY]
    assert st.status == "unknown" and st.attempts == 2
    assert st.outcome is None

    # Answered and saved: succeeded.
    finished(store, 200, "ok")
    assert store.load_state()[KEY].status == "unknown"
    store.record_outcome(record("succeeded"))
    assert store.load_state()[KEY].status == "succeeded"


def test_a_forced_attempt_after_success_that_dies_is_unknown(store: OutputStore) -> None:
    started(store)
    finished(store, 200, "ok")
    store.record_outcome(record("succeeded"))
    started(store)  # --force, then killed while waiting
    assert store.load_state()[KEY].status == "unknown"


def test_keys_are_independent(store: OutputStore) -> None:
    started(store, KEY)
    started(store, OTHER)
    finished(store, 200, "ok", OTHER)
    store.record_outcome(record("succeeded", OTHER))
    finished(store, None, "no_answer", KEY)
    states = store.load_state()
    assert set(states) == {KEY, OTHER}
    assert states[KEY].status == "unknown"
    assert states[OTHER].status == "succeeded"
    assert states[OTHER].attempts == states[KEY].attempts == 1


def test_events_without_a_key_are_ignored(store: OutputStore) -> None:
    store.journal("run_started", manifest="m.csv")
    store.journal("attempt_started", idempotency_key=None)
    assert store.load_state() == {}


def test_a_torn_journal_line_is_ignored(store: OutputStore) -> None:
    started(store)
    finished(store, 200, "ok")
    with store.journal_path.open("ab") as fh:
        fh.write(
            json.dumps({"event": "outcome", **dataclasses.asdict(record())}).encode()[:40]
        )  # kill -9 mid-write
    assert store.load_state()[KEY].status == "unknown"


def test_the_next_run_appends_after_a_torn_line_without_losing_its_events(tmp_path: Path) -> None:
    """A crash leaves a line with no newline; the next run's first event must not be glued onto it."""
    first = OutputStore(tmp_path / "out")
    first.prepare()
    started(first, OTHER)
    with first.journal_path.open("ab") as fh:
        fh.write(b'{"event":"attempt_started","idempotency_key":"ib1-')  # kill -9 mid-write

    second = OutputStore(tmp_path / "out")  # the next run
    started(second)
    finished(second, 200, "ok")
    second.record_outcome(record("succeeded"))
    states = second.load_state()
    assert states[KEY].status == "succeeded" and states[KEY].attempts == 1
    assert states[OTHER].status == "unknown"
    # usage.jsonl is healed the same way.
    with second.usage_path.open("ab") as fh:
        fh.write(b'{"attempt": 1, "http_st')
    third = OutputStore(tmp_path / "out")
    third.append_usage({"attempt": 2})
    assert list(read_jsonl(third.usage_path)) == [{"attempt": 2}]


def test_outcome_round_trips_every_field(store: OutputStore) -> None:
    rec = record(
        "no_image",
        paths=["images/mug_0.no_image.json"],
        attempts=1,
        finish_reason="SAFETY",
        error="no image (finishReason SAFETY): ünïcode",
        request_id="req-1",
    )
    store.record_outcome(rec)
    assert store.load_state()[KEY].outcome == rec


# --- journal: thread safety ------------------------------------------------------------------------------


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

    for path in (store.journal_path, store.usage_path):
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


# --- results.csv -----------------------------------------------------------------------------------------


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

    with store.results_path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
    assert header == [*RESULT_COLUMNS, "sku", "colour"]
    assert header[: len(RESULT_COLUMNS)] == [
        "job_id", "request_index", "turn_index", "variant", "status", "paths", "images", "width", "height",
        "mime_type", "model", "route", "idempotency_key", "attempts", "finish_reason", "error",
        "request_id",
    ]  # fmt: skip

    with store.results_path.open(newline="") as fh:
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
    assert "None" not in store.results_path.read_text()
    assert leftovers(store.root) == []


def test_write_results_rewrites_the_whole_table(store: OutputStore) -> None:
    store.write_results([record().to_row(), record(key=OTHER).to_row()], [])
    store.write_results([record("skipped").to_row()], [])
    with store.results_path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["status"] for r in rows] == ["skipped"]


def test_to_row_has_exactly_the_result_columns() -> None:
    row = record(paths=[], images=0).to_row()
    assert list(row) == list(RESULT_COLUMNS)
    assert row["paths"] == "" and row["width"] == ""


def test_files_and_chains(store: OutputStore) -> None:
    assert store.write_file("mug_0.png", b"\x89PNG") == "images/mug_0.png"
    assert (store.root / "images" / "mug_0.png").read_bytes() == b"\x89PNG"
    assert store.load_chain("mug", 0) is None
    store.save_chain("mug", 0, {"turns": [{"key": KEY}]})
    assert store.load_chain("mug", 0) == {"turns": [{"key": KEY}]}
    store.write_run({"counts": {"succeeded": 1}})
    assert json.loads(store.run_path.read_text()) == {"counts": {"succeeded": 1}}
    assert leftovers(store.images_dir) == [] and leftovers(store.chains_dir) == []


# --- load_state: answered, files on disk, superseded outcomes ----------------------------------------------


def answered(store: OutputStore, rec: RequestRecord) -> None:
    from dataclasses import asdict

    store.journal("answered", **asdict(rec))


def test_answered_with_its_files_on_disk_is_succeeded(store: OutputStore) -> None:
    # Killed after the files were written, before the outcome was journaled.
    rec = record(paths=["images/mug/0-0123.png", "images/mug/0-0123-1.png"], images=2, attempts=1)
    started(store)
    finished(store, 200, "ok")
    answered(store, rec)
    for path in rec.paths:
        store.write_file(path.removeprefix("images/"), b"\x89PNG")
    st = store.load_state()[KEY]
    assert st.status == "succeeded"
    assert st.outcome == rec


def test_answered_with_a_file_missing_is_unknown(store: OutputStore) -> None:
    # Killed between `answered` and the last file: billed, but not saved.
    rec = record(paths=["images/mug/0-0123.png", "images/mug/0-0123-1.png"], images=2)
    started(store)
    finished(store, 200, "ok")
    answered(store, rec)
    store.write_file("mug/0-0123.png", b"\x89PNG")  # the second one never made it
    st = store.load_state()[KEY]
    assert st.status == "unknown" and st.outcome is None
    assert st.answered == rec


def test_answered_then_a_new_attempt_in_flight_is_unknown(store: OutputStore) -> None:
    rec = record(paths=["images/mug/0-0123.png"])
    started(store)
    finished(store, 200, "ok")
    answered(store, rec)
    store.write_file("mug/0-0123.png", b"\x89PNG")
    started(store, attempt=1)  # --force, killed while waiting for the answer
    st = store.load_state()[KEY]
    assert st.status == "unknown" and st.pending and st.attempts == 2


def test_a_damaged_answered_record_leaves_the_key_in_doubt(store: OutputStore) -> None:
    started(store)
    finished(store, 200, "ok")
    store.journal("answered", idempotency_key=KEY, paths=[])  # no job_id, status...: not a record
    st = store.load_state()[KEY]
    assert st.status == "unknown" and st.answered is None


def test_a_succeeded_outcome_whose_file_was_deleted_is_made_again(store: OutputStore) -> None:
    store.write_file("mug/0-0123.png", b"\x89PNG")
    started(store)
    finished(store, 200, "ok")
    store.record_outcome(record(paths=["images/mug/0-0123.png"]))
    assert store.load_state()[KEY].status == "succeeded"

    (store.images_dir / "mug" / "0-0123.png").unlink()
    st = store.load_state()[KEY]
    assert st.status is None and st.outcome is None and st.attempts == 0


def test_a_no_image_outcome_stands_without_its_detail_file(store: OutputStore) -> None:
    started(store)
    finished(store, 200, "ok")
    store.record_outcome(record("no_image", paths=["images/mug/0-0123.no_image.json"]))
    assert store.load_state()[KEY].status == "no_image"  # only succeeded outputs are remade


def test_a_new_attempt_after_an_outcome_supersedes_it(store: OutputStore) -> None:
    started(store)
    finished(store, 503, "error")
    store.record_outcome(record("failed", error="HTTP 503"))
    assert store.load_state()[KEY].status == "failed"

    started(store)  # the next run resends it
    st = store.load_state()[KEY]
    assert st.status == "unknown" and st.pending and st.outcome is None and st.attempts == 2

    finished(store, None, "no_answer")
    st = store.load_state()[KEY]
    assert st.status == "unknown" and not st.pending and st.unanswered

    store.record_outcome(record("unknown", error="no answer"))
    started(store, attempt=1)  # --retry-unknown
    finished(store, 503, "error", attempt=1)
    st = store.load_state()[KEY]
    assert st.status == "failed" and not st.unanswered and st.attempts == 3  # the old doubt was settled


def test_an_unanswered_attempt_before_a_retried_error_keeps_the_key_in_doubt(store: OutputStore) -> None:
    started(store, attempt=1)
    finished(store, None, "no_answer", attempt=1)
    started(store, attempt=2)
    finished(store, 503, "error", attempt=2)  # killed before the outcome
    assert store.load_state()[KEY].status == "unknown"


# --- hold_and_merge() and file modes ---------------------------------------------------------------------


def test_hold_and_merge_refuses_a_second_holder_and_releases_after_the_block(tmp_path: Path) -> None:
    from imagebatch.work.store import OutputLockedError

    first, second = OutputStore(tmp_path / "out"), OutputStore(tmp_path / "out")
    with first.hold_and_merge():
        # flock belongs to the open file description: a second open in this same process conflicts.
        with pytest.raises(OutputLockedError, match="another imagebatch run"):
            with second.hold_and_merge():
                pytest.fail("the folder was entered twice")
        with pytest.raises(OutputLockedError):
            with first.hold_and_merge():
                pytest.fail("the folder was entered twice by the same store")
    with second.hold_and_merge():
        pass

    with pytest.raises(ZeroDivisionError):
        with first.hold_and_merge():
            1 / 0  # noqa: B018
    with second.hold_and_merge():  # released when the block raised too
        pass
    assert (tmp_path / "out" / ".imagebatch.lock").is_file()


def test_hold_and_merge_creates_the_folder(tmp_path: Path) -> None:
    store = OutputStore(tmp_path / "new" / "out")
    with store.hold_and_merge():
        assert store.root.is_dir()


def test_outputs_are_readable_by_others(store: OutputStore) -> None:
    import stat

    old = os.umask(0o077)  # mkstemp makes 0600 whatever the umask; the store must not keep that
    try:
        write_atomic(store.root / "a.bin", b"x")
        store.write_file("mug/0-0123.png", b"\x89PNG")
        store.save_chain("mug", 0, {"turns": []})
    finally:
        os.umask(old)
    for path in (store.root / "a.bin", store.images_dir / "mug" / "0-0123.png", store.chain_path("mug", 0)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_journal_lines_written_together_share_an_fsync_and_each_returns_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: threads whose lines one fsync covers do not each sync; none returns before an fsync
    that began after its line was written."""
    store = OutputStore(tmp_path)
    store.prepare()
    first_sync = threading.Event()
    lines_at_fsync: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if not lines_at_fsync:  # hold the first fsync until every thread's line is written
            first_sync.wait(timeout=30)
        lines_at_fsync.append(len(store.journal_path.read_bytes().splitlines()))
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
    while store.log.written.get(store.journal_path, 0) < 8 and time.monotonic() < deadline:
        time.sleep(0.001)  # real threads: wait (bounded) until all eight lines are written
    first_sync.set()
    for t in threads:
        t.join(timeout=30)
    assert len(returned) == 8 and all(n == 8 for n in returned)
    assert len(lines_at_fsync) <= 2  # one fsync (plus at most the first, already begun) for eight lines
    assert len(store.journal_path.read_bytes().splitlines()) == 8


def test_shards_write_their_own_files_and_a_run_holding_the_folder_alone_merges_them(tmp_path: Path) -> None:
    from imagebatch.work.store import OutputLockedError

    one, two = OutputStore(tmp_path, shard="0-of-2"), OutputStore(tmp_path, shard="1-of-2")
    with one.shard_hold(), two.shard_hold():  # shards share the folder, each holds its own shard
        with pytest.raises(OutputLockedError):
            with OutputStore(tmp_path).hold_and_merge():  # a run that is not sharded waits for them
                pass
        with pytest.raises(OutputLockedError, match="shard 0-of-2"):
            with OutputStore(tmp_path, shard="0-of-2").shard_hold():  # the same shard twice: never
                pass
        one.record_outcome(record(key=KEY))
        two.record_outcome(record(key=OTHER, status="failed"))
        one.append_usage({"idempotency_key": KEY})
    assert one.journal_path.name == "journal.shard-0-of-2.jsonl"
    plain = OutputStore(tmp_path)
    assert {k: s.status for k, s in plain.load_state().items()} == {KEY: "succeeded", OTHER: "failed"}
    with plain.hold_and_merge():
        assert not list(tmp_path.glob("*.shard-*.jsonl"))  # merged into the folder's own files
    assert len(list(read_jsonl(plain.journal_path))) == 2 and len(list(read_jsonl(plain.usage_path))) == 1
    assert {k: s.status for k, s in plain.load_state().items()} == {KEY: "succeeded", OTHER: "failed"}
