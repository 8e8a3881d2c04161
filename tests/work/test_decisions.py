"""Review decisions: appended whole, the last one for an image wins, nothing of two writers lost, on a
local folder and on a real S3-compatible server (moto); an undo takes back only its reviewer's decision in
force (a history, not a stack); a note longer than the page's cap is never read, nor sent by a redo (the
emulator over real HTTP, in the session's Prefect harness)."""

from __future__ import annotations

import json
import logging
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import run_flow, write_jsonl

from imagebatch.manifest import load_manifest, plan
from imagebatch.storage.bucket import BucketBackend
from imagebatch.storage.folder import FolderBackend
from imagebatch.storage.layout import REVIEW_FILE
from imagebatch.storage.location import Location
from imagebatch.work.decisions import (
    MAX_NOTE,
    Decision,
    History,
    decided,
    iter_decisions,
    now,
    read_decisions,
    record_decision,
)


def _decide(location: Location) -> None:
    first = record_decision(location, Decision("ib1-a", 1, "rejected", note="wrong colour", reviewer="ann"))
    assert first.at.endswith("Z")
    record_decision(location, Decision("ib1-b", 1, "approved", reviewer="bob"))
    record_decision(location, Decision("ib1-a", 1, "cleared", reviewer="ann"))
    record_decision(location, Decision("ib1-a", 1, "approved", reviewer="ann"))
    record_decision(location, Decision("ib1-c", 2, "rejected", note="handle missing ✂", reviewer="ann"))
    record_decision(location, Decision("ib1-b", 1, "cleared", reviewer="bob"))


def _check(location: Location) -> None:
    assert len(list(iter_decisions(location))) == 6
    now = read_decisions(location)
    assert {k: d.decision for k, d in now.items()} == {
        "ib1-a": "approved",
        "ib1-b": "cleared",
        "ib1-c": "rejected",
    }
    assert now["ib1-c"].note == "handle missing ✂" and now["ib1-c"].variant == 2
    assert set(decided(location)) == {"ib1-a", "ib1-c"}


def test_the_last_decision_wins_in_a_folder(tmp_path: Path) -> None:
    folder = FolderBackend(tmp_path)
    _decide(folder)
    _check(folder)
    assert len((tmp_path / REVIEW_FILE).read_text().splitlines()) == 6


def test_the_last_decision_wins_in_a_bucket(s3: Any) -> None:
    name = s3.bucket()
    bucket = BucketBackend(f"s3://{name}/run")
    _decide(bucket)
    _check(bucket)
    names = sorted(s3.objects(name, "run/review/"))
    assert len(names) == 6 and all(name.endswith(".json") for name in names)


def test_a_torn_line_loses_only_itself(tmp_path: Path) -> None:
    folder = FolderBackend(tmp_path)
    record_decision(folder, Decision("ib1-a", 1, "approved"))
    with (tmp_path / REVIEW_FILE).open("ab") as fh:
        fh.write(b'{"key":"ib1-b","variant":1,"deci')  # a crash mid-write
    record_decision(folder, Decision("ib1-c", 1, "rejected", note="n"))
    with (tmp_path / REVIEW_FILE).open("ab") as fh:
        fh.write(b'{"key":"","decision":"approved"}\n{"key":"ib1-d","decision":"maybe"}\n[1]\n')
    assert set(read_decisions(folder)) == {"ib1-a", "ib1-c"}


def test_an_unknown_decision_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="approved, rejected, cleared"):
        record_decision(FolderBackend(tmp_path), Decision("ib1-a", 1, "maybe"))  # type: ignore[arg-type]
    assert not (tmp_path / REVIEW_FILE).exists()


def _writer(root: str, who: str, n: int) -> None:
    folder = FolderBackend(Path(root))
    for i in range(n):
        record_decision(folder, Decision(f"ib1-{who}-{i}", 1, "approved", note="x" * MAX_NOTE, reviewer=who))


@pytest.mark.slow  # processes of their own
def test_two_writers_at_once_lose_nothing(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), who, 150)) for who in ("ann", "bob")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    decisions = read_decisions(FolderBackend(tmp_path))
    assert len(decisions) == 300 and all(len(d.note) == MAX_NOTE for d in decisions.values())


def test_history_an_undo_takes_back_only_its_reviewers_decision_in_force(tmp_path: Path) -> None:
    """The issue's record: A approves, B rejects, C rejects with a note, then an undo of B's (as an older
    page wrote it: A's approval repeated, marked as an undo) is recorded after C's. It changes nothing."""
    folder = FolderBackend(tmp_path)
    for decision in (
        Decision("ib1-a", 1, "approved", reviewer="alice"),
        Decision("ib1-a", 1, "rejected", reviewer="bob"),
        Decision("ib1-a", 1, "rejected", "handle missing: redo", reviewer="carol"),
        Decision("ib1-a", 1, "approved", reviewer="bob", undo=True),
    ):
        record_decision(folder, decision)
    now = decided(folder)["ib1-a"]
    assert (now.decision, now.reviewer, now.note) == ("rejected", "carol", "handle missing: redo")
    history = History()
    assert [history.apply(d) for d in iter_decisions(folder)] == [True, True, True, False]
    assert history.refusal("ib1-a", "bob") == (
        "carol decided it since you did (rejected: handle missing: redo), and that stands"
    )
    assert history.refusal("ib1-a", "dave") == "nothing of yours to undo on this image (undone already)"
    # carol takes hers back: bob's rejection is in force again, and then his undo brings alice's back
    record_decision(folder, history.undo("ib1-a", "carol"))
    assert read_decisions(folder)["ib1-a"].reviewer == "bob"
    history = History()
    for decision in iter_decisions(folder):
        history.apply(decision)
    assert history.refusal("ib1-a", "bob") is None
    record_decision(folder, history.undo("ib1-a", "bob"))
    assert read_decisions(folder)["ib1-a"] == next(iter_decisions(folder))  # alice's, as she made it


class _Heard(logging.Handler):
    """Every record a logger emits while attached."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _long_line(key: str, note: str) -> bytes:
    data = {"key": key, "variant": 1, "decision": "rejected", "note": note, "reviewer": "script", "at": now()}
    return json.dumps(data).encode() + b"\n"


def test_a_note_longer_than_the_pages_cap_is_refused_with_the_file_and_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = FolderBackend(tmp_path)
    record_decision(folder, Decision("ib1-a", 1, "approved", reviewer="ann"))
    with (tmp_path / REVIEW_FILE).open("ab") as fh:
        fh.write(_long_line("ib1-a", "x" * (MAX_NOTE + 1)))
    record_decision(folder, Decision("ib1-b", 1, "rejected", "x" * MAX_NOTE, reviewer="ann"))  # the cap: read
    with caplog.at_level(logging.WARNING, "imagebatch.review"):
        decisions = read_decisions(folder)
    # The line counts for nothing: ann's approval stays in force, the note is never read
    assert decisions["ib1-a"].decision == "approved" and len(decisions["ib1-b"].note) == MAX_NOTE
    assert caplog.messages == [
        f"{tmp_path / REVIEW_FILE} line 2: a note of 2,001 characters, longer than the review page's 2,000:"
        " the decision is not read"
    ]
    with pytest.raises(ValueError, match="a note is at most 2,000 characters, not 2,001"):
        record_decision(folder, Decision("ib1-c", 1, "rejected", "x" * (MAX_NOTE + 1)))
    assert len((tmp_path / REVIEW_FILE).read_bytes().splitlines()) == 3  # nothing written


def test_a_redo_never_sends_a_note_longer_than_the_pages_cap(
    service_env: Any, tmp_path: Path, out: Path
) -> None:
    """A 1 MB note appended to review.jsonl by hand is not the edit instruction: the rejection before it
    is (its note sent), and the emulator's ledger shows no request carrying the long one."""
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": "a", "prompt": "a mug", "model": "native-image-2"}])
    run_flow(manifest=str(manifest), out=str(out))
    (first,) = plan(load_manifest(manifest))
    record_decision(FolderBackend(out), Decision(first.idempotency_key, 1, "rejected", "too dark", "ann"))
    long = "make it brighter " * 60_000
    with (out / REVIEW_FILE).open("ab") as fh:
        fh.write(_long_line(first.idempotency_key, long))
    heard = _Heard()
    logging.getLogger("imagebatch.review").addHandler(heard)
    try:
        info = run_flow(manifest=str(manifest), out=str(out), redo="rejected", edit=True)
    finally:
        logging.getLogger("imagebatch.review").removeHandler(heard)
    assert info["redo"]["edits"] == 1
    said = f"{out / REVIEW_FILE} line 2: a note of 1,020,000 characters, longer than the review page's 2,000"
    # Said once, though the run reads the record three times. Heard on the logger itself, not on
    # stderr or caplog: Prefect's logging set-up replaces the root's handlers (pytest's among them),
    # and its console handler keeps the stream it was made with, which after other tests is not this
    # test's. A record forwarded to the run's logger too is the same object.
    assert len({id(r) for r in heard.records if said in r.getMessage()}) == 1
    (edit,) = [e for e in service_env.ledger() if e["idempotency_key"] != first.idempotency_key]
    assert "too dark" in edit["prompt"]
    assert not [e for e in service_env.ledger() if "make it brighter" in e["prompt"]]
