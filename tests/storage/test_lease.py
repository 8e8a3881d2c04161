"""The lease on an object store's prefix (`storage.lease`) against a real S3-compatible server (moto):
create-only, compare-and-swap, expiry with an injected clock, and a sharded run's leases."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
from helpers.records import record

from imagebatch.storage.lease import LEASE_SECONDS, RENEW_SECONDS, SAFETY_SECONDS, Lease
from imagebatch.storage.objectstore import ObjectLocation
from imagebatch.work.store import OutputLockedError, OutputStore


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


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
    with store.backend.hold():
        store.journal("attempt_started", idempotency_key="k1", attempt=1)
        clock.now += LEASE_SECONDS - SAFETY_SECONDS  # no renewal landed in that time (paused, cut off)
        with pytest.raises(OSError, match="could not be renewed"):
            store.journal("attempt_started", idempotency_key="k2", attempt=1)
        assert store.backend.watch.error is not None
    assert RENEW_SECONDS * 2 < LEASE_SECONDS - SAFETY_SECONDS  # two renewals may fail before it stops


def _sent(store: OutputStore, key: str) -> None:
    """What a shard journals for one request it sent and got an image for (files, then the outcome)."""
    rec = record(key=key, paths=[f"images/j/{key}.png"])
    store.journal("attempt_started", idempotency_key=key, attempt=1)
    store.journal("attempt_finished", idempotency_key=key, outcome="ok", sync=False)
    store.write_file(f"j/{key}.png", b"png")
    store.journal("answered", **asdict(rec))
    store.record_outcome(rec)


def test_a_sharded_runs_shards_write_their_own_segments_under_the_parents_lease_which_then_compacts(
    s3: Any,
) -> None:
    url = f"s3://{s3.bucket()}/sharded"
    parent = OutputStore(url)
    with parent.backend.hold_sharded(2):
        with pytest.raises(OutputLockedError, match=r"another imagebatch run \(.* pid \d+\) is using s3://"):
            with OutputStore(url).backend.hold():  # a run that is not sharded, meanwhile
                pass
        first, second = OutputStore(url, "0-of-2"), OutputStore(url, "1-of-2")
        with first.backend.shard_hold(), second.backend.shard_hold():
            assert parent.backend.shard_held("0-of-2") and parent.backend.shard_held("1-of-2")
            with pytest.raises(OutputLockedError, match=r"shard 0-of-2 \(.* pid \d+\) is using s3://"):
                with OutputStore(url, "0-of-2").backend.shard_hold():  # the same shard twice
                    pass
            _sent(first, "a")
            _sent(second, "b")
            first.backend.sync()  # a shard's end: its lines committed, never compacted (the parent does)
            second.backend.sync()
            segments = parent.backend.list("journal/")  # type: ignore[attr-defined]
        assert not parent.backend.shard_held("0-of-2") and not parent.backend.shard_held("1-of-2")  # released
        assert {n.split("-", 1)[1].rsplit("-", 1)[0] for n in segments} == {"0-of-2", "1-of-2"}
        with parent.backend.hold():  # the parent's end, under the same lease
            states = parent.load_state()
            parent.backend.sync()
            compacted = parent.backend.list("journal/")  # type: ignore[attr-defined]
    assert states["a"].status == states["b"].status == "succeeded"
    # One object, named by the highest run it holds (the shards numbered theirs at their own start).
    assert compacted == [f"journal/{max(n[8:16] for n in segments)}-compact.jsonl"]
    replayed = OutputStore(url).load_state()
    assert replayed["a"].status == replayed["b"].status == "succeeded"
    with OutputStore(url).backend.hold():  # released at the end: free at once
        pass


def test_a_shard_that_starts_once_its_parent_merges_is_refused_and_one_still_writing_is_waited_for(
    s3: Any,
) -> None:
    """The parent shuts its shards out before it merges (`shut_out_shards`): a shard that a worker starts
    only then (Prefect's server back after the parent wrote it off) is refused, and one that started
    before still holds its own lease, which the parent sees (`shard_held`) before it merges."""
    url = f"s3://{s3.bucket()}/shut"
    parent = OutputStore(url)
    with parent.backend.hold_sharded(2):
        early = OutputStore(url, "0-of-2")
        with early.backend.shard_hold():
            parent.backend.shut_out_shards()
            with pytest.raises(OutputLockedError, match=r"began to write its records into s3://.*nothing"):
                with OutputStore(url, "1-of-2").backend.shard_hold():
                    pass
            assert parent.backend.shard_held("0-of-2")  # the parent waits for it (`shards_released`)
            _sent(early, "e")  # its parent's lease is still live: it goes on writing until it ends
            early.backend.sync()
        with parent.backend.hold():
            assert parent.load_state()["e"].status == "succeeded"


def test_a_shard_is_refused_unless_its_sharded_run_holds_the_prefix(s3: Any) -> None:
    url = f"s3://{s3.bucket()}/alone"
    with pytest.raises(OutputLockedError, match="only while its sharded run holds it, and no run does"):
        with OutputStore(url, "0-of-2").backend.shard_hold():
            pass
    with OutputStore(url).backend.hold():
        with pytest.raises(
            OutputLockedError, match=r"a run that is not sharded \(.* pid \d+\) is using s3://"
        ):
            with OutputStore(url, "0-of-2").backend.shard_hold():
                pass
    with OutputStore(url).backend.hold_sharded(3):
        with pytest.raises(OutputLockedError, match="another sharded run"):
            with OutputStore(url, "0-of-2").backend.shard_hold():
                pass
    assert not OutputStore(url).backend.shard_held("0-of-2")  # each refusal released its shard lease


def test_a_shard_stops_writing_once_its_parent_stops_renewing_before_another_run_can_take_over(
    s3: Any,
) -> None:
    clock = Clock()
    url = f"s3://{s3.bucket()}/orphan"
    parent, shard = OutputStore(url, clock=clock), OutputStore(url, "0-of-1", clock=clock)
    with parent.backend.hold_sharded(1), shard.backend.shard_hold():
        assert parent.backend.lease is not None and shard.backend.lease is not None
        shard.journal("attempt_started", idempotency_key="k1", attempt=1)
        clock.now += RENEW_SECONDS
        parent.backend.lease.renew()  # the parent is alive: renewed (by hand; its thread waits real seconds)
        shard.backend.lease.renew()
        clock.now += LEASE_SECONDS - SAFETY_SECONDS - 1  # past the first expiry the shard saw
        shard.journal("attempt_started", idempotency_key="k2", attempt=1)  # read again: renewed, live
        shard.backend.lease.renew()  # the shard's own lease stays live from here on: only the parent's lapses
        clock.now += 2  # the parent's lease is now within its safety margin: its process died
        with pytest.raises(OSError, match="its sharded run no longer holds s3://"):
            shard.journal("attempt_started", idempotency_key="k3", attempt=1)
        assert shard.backend.watch.error is not None
        clock.now += SAFETY_SECONDS  # the parent's lease expired: another run takes the prefix over
        with OutputStore(url, clock=clock).backend.hold():
            shard.backend.segments._failed.clear()  # type: ignore[union-attr]  # as if the shard tried again
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
