"""The journal's replay into each key's state (`OutputStore.load_state`, `work.replay`): attempts, answers,
outcomes, files on disk, torn and damaged lines."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from helpers.records import KEY, OTHER, answered, finished, record, started

from imagebatch.storage.appendlog import read_jsonl
from imagebatch.work import replay as replay_module
from imagebatch.work.store import OutputStore


@pytest.fixture(params=["memory", "disk"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> OutputStore:
    """An output folder; its state replayed in memory, or (`disk`) through the on-disk index alone (no
    window: every event's key read from the file and written back), so every rule is seen both ways."""
    if request.param == "disk":
        monkeypatch.setattr(replay_module, "WINDOW", 0)
    s = OutputStore(tmp_path / "out")
    s.backend.prepare()
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
    with store.backend.path("journal").open("ab") as fh:
        fh.write(
            json.dumps({"event": "outcome", **dataclasses.asdict(record())}).encode()[:40]
        )  # kill -9 mid-write
    assert store.load_state()[KEY].status == "unknown"


def test_the_next_run_appends_after_a_torn_line_without_losing_its_events(tmp_path: Path) -> None:
    """A crash leaves a line with no newline; the next run's first event must not be glued onto it."""
    first = OutputStore(tmp_path / "out")
    first.backend.prepare()
    started(first, OTHER)
    with first.backend.path("journal").open("ab") as fh:
        fh.write(b'{"event":"attempt_started","idempotency_key":"ib1-')  # kill -9 mid-write

    second = OutputStore(tmp_path / "out")  # the next run
    started(second)
    finished(second, 200, "ok")
    second.record_outcome(record("succeeded"))
    states = second.load_state()
    assert states[KEY].status == "succeeded" and states[KEY].attempts == 1
    assert states[OTHER].status == "unknown"
    # usage.jsonl is healed the same way.
    with second.backend.path("usage").open("ab") as fh:
        fh.write(b'{"attempt": 1, "http_st')
    third = OutputStore(tmp_path / "out")
    third.append_usage({"attempt": 2})
    assert list(read_jsonl(third.backend.path("usage"))) == [{"attempt": 2}]


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

    ((store.backend.root / "images") / "mug" / "0-0123.png").unlink()
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
