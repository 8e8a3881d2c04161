"""The object-store kind of output location against a real S3-compatible server (moto): conditional
writes, the journal's segments and their replay, the lease (create-only, compare-and-swap, expiry with an
injected clock), and the store's refusals."""

from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Any

import pytest

from imagebatch.tasks.objectstore import (
    LEASE_SECONDS,
    RENEW_SECONDS,
    SAFETY_SECONDS,
    Lease,
    ObjectLocation,
    journal_objects,
)
from imagebatch.tasks.store import OutputLockedError, OutputStore, RequestRecord


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _record(key: str, status: str = "succeeded", paths: list[str] | None = None) -> RequestRecord:
    return RequestRecord(
        job_id="j", request_index=0, turn_index=0, status=status,  # type: ignore[arg-type]
        model="m", route="r", idempotency_key=key, paths=paths or [],
    )  # fmt: skip


def test_the_server_honours_create_only_and_compare_and_swap(s3: Any) -> None:
    loc = ObjectLocation(f"s3://{s3.bucket()}/p")
    etag = loc.create("a", b"one")
    assert etag is not None
    assert loc.create("a", b"two") is None  # If-None-Match: * refused
    assert loc.get("a") == b"one"
    assert loc.create("a", b"one") == etag  # a retried create of our own bytes counts as done
    new = loc.replace("a", b"three", etag)
    assert new is not None and new != etag
    assert loc.replace("a", b"four", etag) is None  # If-Match on a stale ETag refused
    assert loc.get("a") == b"three"


def test_journal_segments_replay_in_order_and_compact_into_one_object(s3: Any) -> None:
    url = f"s3://{s3.bucket()}/run"
    store = OutputStore(url)
    with store.hold_and_merge():
        store.journal("attempt_started", idempotency_key="k1", attempt=1)
        store.journal("attempt_finished", idempotency_key="k1", outcome="ok", sync=False)
        store.write_file("j/0-k1.png", b"png")
        store.journal("answered", **asdict(_record("k1", paths=["images/j/0-k1.png"])))
        store.record_outcome(_record("k1", paths=["images/j/0-k1.png"]))
        store.journal("attempt_started", idempotency_key="k2", attempt=1)
        store.append_usage({"idempotency_key": "k1", "attempt": 1, "route": "r", "model": "m"})
        before = journal_objects(store.location.list("journal/"))  # type: ignore[attr-defined]
        assert len(before) == 3  # one PUT per synced line here (one thread): started, answered, started
        states = store.load_state()
        store.sync()  # the end of a run: the rest committed, then compacted
        after = store.location.list("journal/")  # type: ignore[attr-defined]
    assert states["k1"].status == "succeeded" and states["k2"].status == "unknown"
    assert after == ["journal/00000001-compact.jsonl"]
    again = OutputStore(url)
    replayed = again.load_state()
    assert replayed["k1"].status == "succeeded" and replayed["k2"].status == "unknown"
    assert [u["attempt"] for u in again.usage_lines()] == [1]
    with again.hold_and_merge():  # the next run's segments sort after the compaction
        again.journal("attempt_started", idempotency_key="k3", attempt=1)
        assert again.location.list("journal/")[-1].startswith("journal/00000002-")  # type: ignore[attr-defined]
    assert again.load_state()["k3"].status == "unknown"


def test_group_commit_shares_one_put_between_threads(s3: Any) -> None:
    store = OutputStore(f"s3://{s3.bucket()}/g")
    with store.hold_and_merge():
        assert store._segments is not None
        barrier = threading.Barrier(16)

        def one(i: int) -> None:
            barrier.wait()
            store.journal("attempt_started", idempotency_key=f"k{i}", attempt=1)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        puts = store._segments.puts
    assert 1 <= puts < 16
    assert len(store.load_state()) == 16


def test_a_second_live_run_is_refused_and_a_dead_runs_lease_is_taken_over_after_expiry(s3: Any) -> None:
    loc = ObjectLocation(f"s3://{s3.bucket()}/l")
    clock = Clock()
    dead = Lease(loc, "another imagebatch run", clock=clock)
    dead.acquire()  # never renewed, never released: its process died
    clock.now += LEASE_SECONDS - 1
    with pytest.raises(OutputLockedError, match=r"another imagebatch run \(.* pid \d+\) is using s3://"):
        Lease(loc, "another imagebatch run", clock=clock).acquire()
    clock.now += 2
    taker = Lease(loc, "another imagebatch run", clock=clock)
    taker.acquire()
    with pytest.raises(OutputLockedError, match="taken over"):
        dead.renew()  # the dead run, were it to wake, finds the lease gone
    taker.renew()
    taker.release()
    Lease(loc, "another imagebatch run", clock=clock).acquire()  # released: free at once


def test_a_holder_stops_writing_once_its_lease_is_near_expiry(s3: Any) -> None:
    clock = Clock()
    store = OutputStore(f"s3://{s3.bucket()}/f", clock=clock)
    with store.hold_and_merge():
        store.journal("attempt_started", idempotency_key="k1", attempt=1)
        clock.now += LEASE_SECONDS - SAFETY_SECONDS  # no renewal landed in that time (paused, cut off)
        with pytest.raises(OSError, match="could not be renewed"):
            store.journal("attempt_started", idempotency_key="k2", attempt=1)
        assert store.write_error is not None
    assert RENEW_SECONDS * 2 < LEASE_SECONDS - SAFETY_SECONDS  # two renewals may fail before it stops


def test_an_unsettled_answer_counts_as_done_only_if_its_files_are_there(s3: Any) -> None:
    store = OutputStore(f"s3://{s3.bucket()}/u")
    with store.hold_and_merge():
        for key in ("with", "without"):
            store.journal("attempt_started", idempotency_key=key, attempt=1)
            store.journal("attempt_finished", idempotency_key=key, outcome="ok")
            store.journal("answered", **asdict(_record(key, paths=[f"images/j/{key}.png"])))
        store.write_file("j/with.png", b"png")  # then killed: no outcome journaled for either
    states = OutputStore(store.where).load_state()
    assert states["with"].status == "succeeded"
    assert states["without"].status == "unknown"


def test_a_missing_bucket_and_refused_credentials_are_named_without_the_secret(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = ObjectLocation("s3://no-such-bucket-here/p").check()
    assert missing is not None and "the bucket 'no-such-bucket-here' does not exist" in missing
    bucket = s3.bucket()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    refused = ObjectLocation(f"s3://{bucket}/p").check()
    assert refused is not None and "refused the credentials" in refused and f"'{bucket}'" in refused
    assert "wrong-secret-value" not in refused and s3.secret_key not in refused


def test_urls_with_credentials_or_queries_are_refused() -> None:
    for url in ("s3://key:secret@bucket/p", "s3://bucket/p?secret=1", "ftp://bucket/p"):
        with pytest.raises(ValueError, match="credentials come from the environment"):
            ObjectLocation(url)
