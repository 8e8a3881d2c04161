"""The object-store kind of output location against a real S3-compatible server (moto): conditional
writes, the journal's segments and their replay, the lease (create-only, compare-and-swap, expiry with an
injected clock), and the store's refusals."""

from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Any

import pytest

from imagebatch.storage.lease import LEASE_SECONDS, RENEW_SECONDS, SAFETY_SECONDS, Lease
from imagebatch.storage.objectstore import ObjectLocation
from imagebatch.storage.segments import journal_objects
from imagebatch.work.store import OutputLockedError, OutputStore, RequestRecord


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
        assert store.holds.segments is not None
        barrier = threading.Barrier(16)

        def one(i: int) -> None:
            barrier.wait()
            store.journal("attempt_started", idempotency_key=f"k{i}", attempt=1)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        puts = store.holds.segments.puts
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
        with pytest.raises(ValueError, match="credentials come from the environment") as refused:
            ObjectLocation(url)
        assert "secret" not in str(refused.value)  # the URL is named without what it hid


# -- a sharded run into a bucket (issue 19, item 4) --


def _sent(store: OutputStore, key: str) -> None:
    """What a shard journals for one request it sent and got an image for (files, then the outcome)."""
    record = _record(key, paths=[f"images/j/{key}.png"])
    store.journal("attempt_started", idempotency_key=key, attempt=1)
    store.journal("attempt_finished", idempotency_key=key, outcome="ok", sync=False)
    store.write_file(f"j/{key}.png", b"png")
    store.journal("answered", **asdict(record))
    store.record_outcome(record)


def test_a_sharded_runs_shards_write_their_own_segments_under_the_parents_lease_which_then_compacts(
    s3: Any,
) -> None:
    url = f"s3://{s3.bucket()}/sharded"
    parent = OutputStore(url)
    with parent.hold_sharded(2):
        with pytest.raises(OutputLockedError, match=r"another imagebatch run \(.* pid \d+\) is using s3://"):
            with OutputStore(url).hold_and_merge():  # a run that is not sharded, meanwhile
                pass
        first, second = OutputStore(url, "0-of-2"), OutputStore(url, "1-of-2")
        with first.shard_hold(), second.shard_hold():
            assert parent.shard_held("0-of-2") and parent.shard_held("1-of-2")
            with pytest.raises(OutputLockedError, match=r"shard 0-of-2 \(.* pid \d+\) is using s3://"):
                with OutputStore(url, "0-of-2").shard_hold():  # the same shard twice
                    pass
            _sent(first, "a")
            _sent(second, "b")
            first.sync()  # a shard's end: its lines committed, never compacted (the parent does)
            second.sync()
            segments = parent.location.list("journal/")  # type: ignore[attr-defined]
        assert not parent.shard_held("0-of-2") and not parent.shard_held("1-of-2")  # released
        assert {n.split("-", 1)[1].rsplit("-", 1)[0] for n in segments} == {"0-of-2", "1-of-2"}
        with parent.hold_and_merge():  # the parent's end, under the same lease
            states = parent.load_state()
            parent.sync()
            compacted = parent.location.list("journal/")  # type: ignore[attr-defined]
    assert states["a"].status == states["b"].status == "succeeded"
    # One object, named by the highest run it holds (the shards numbered theirs at their own start).
    assert compacted == [f"journal/{max(n[8:16] for n in segments)}-compact.jsonl"]
    replayed = OutputStore(url).load_state()
    assert replayed["a"].status == replayed["b"].status == "succeeded"
    with OutputStore(url).hold_and_merge():  # released at the end: free at once
        pass


def test_a_shard_is_refused_unless_its_sharded_run_holds_the_prefix(s3: Any) -> None:
    url = f"s3://{s3.bucket()}/alone"
    with pytest.raises(OutputLockedError, match="only while its sharded run holds it, and no run does"):
        with OutputStore(url, "0-of-2").shard_hold():
            pass
    with OutputStore(url).hold_and_merge():
        with pytest.raises(
            OutputLockedError, match=r"a run that is not sharded \(.* pid \d+\) is using s3://"
        ):
            with OutputStore(url, "0-of-2").shard_hold():
                pass
    with OutputStore(url).hold_sharded(3):
        with pytest.raises(OutputLockedError, match="another sharded run"):
            with OutputStore(url, "0-of-2").shard_hold():
                pass
    assert not OutputStore(url).shard_held("0-of-2")  # each refusal released its shard lease


def test_a_shard_stops_writing_once_its_parent_stops_renewing_before_another_run_can_take_over(
    s3: Any,
) -> None:
    clock = Clock()
    url = f"s3://{s3.bucket()}/orphan"
    parent, shard = OutputStore(url, clock=clock), OutputStore(url, "0-of-1", clock=clock)
    with parent.hold_sharded(1), shard.shard_hold():
        assert parent.holds.lease is not None and shard.holds.lease is not None
        shard.journal("attempt_started", idempotency_key="k1", attempt=1)
        clock.now += RENEW_SECONDS
        parent.holds.lease.renew()  # the parent is alive: renewed (by hand; its thread waits real seconds)
        shard.holds.lease.renew()
        clock.now += LEASE_SECONDS - SAFETY_SECONDS - 1  # past the first expiry the shard saw
        shard.journal("attempt_started", idempotency_key="k2", attempt=1)  # read again: renewed, live
        shard.holds.lease.renew()  # the shard's own lease stays live from here on: only the parent's lapses
        clock.now += 2  # the parent's lease is now within its safety margin: its process died
        with pytest.raises(OSError, match="its sharded run no longer holds s3://"):
            shard.journal("attempt_started", idempotency_key="k3", attempt=1)
        assert shard.write_error is not None
        clock.now += SAFETY_SECONDS  # the parent's lease expired: another run takes the prefix over
        with OutputStore(url, clock=clock).hold_and_merge():
            shard.holds.segments._failed.clear()  # type: ignore[union-attr]  # as if the shard tried again
            with pytest.raises(OSError, match="its sharded run no longer holds"):
                shard.journal("attempt_started", idempotency_key="k4", attempt=1)
    keys = set(OutputStore(url).load_state())
    assert keys == {"k1", "k2"}  # nothing the shard was refused reached the journal


def test_the_parent_waits_for_a_killed_shards_lease_to_expire_but_not_for_a_live_one(s3: Any) -> None:
    from imagebatch.run.shards import shards_released

    clock = Clock()
    loc = ObjectLocation(f"s3://{s3.bucket()}/wait")
    store = OutputStore(loc.url, clock=clock)
    killed = Lease(loc, "shard 1-of-2", name=".imagebatch.shard-1-of-2.lease", clock=clock)
    killed.acquire()  # never renewed nor released: its process was killed

    def sleep(seconds: float) -> None:
        clock.now += seconds

    shards_released(store, 2, sleep=sleep, clock=clock)
    assert clock.now - 1_000_000.0 >= LEASE_SECONDS  # it waited for the lease to expire

    alive = Lease(loc, "shard 0-of-2", name=".imagebatch.shard-0-of-2.lease", clock=clock)
    alive.acquire()

    def renewing(seconds: float) -> None:
        clock.now += seconds
        alive.renew()  # still writing: its run was marked ended while it was alive

    with pytest.raises(OutputLockedError, match="shard 0-of-2 \\(still writing\\) is using s3://"):
        shards_released(store, 2, sleep=renewing, clock=clock)
