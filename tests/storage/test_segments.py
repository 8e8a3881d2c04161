"""The journal as segments in an object store (`storage.segments`) against a real S3-compatible server
(moto): their order, replay and compaction, and the group commit shared between threads."""

from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Any

from helpers.records import record

from imagebatch.storage.segments import journal_objects
from imagebatch.work.store import OutputStore


def test_journal_segments_replay_in_order_and_compact_into_one_object(s3: Any) -> None:
    url = f"s3://{s3.bucket()}/run"
    store = OutputStore(url)
    with store.backend.hold():
        store.journal("attempt_started", idempotency_key="k1", attempt=1)
        store.journal("attempt_finished", idempotency_key="k1", outcome="ok", sync=False)
        store.write_file("j/0-k1.png", b"png")
        store.journal("answered", **asdict(record(key="k1", paths=["images/j/0-k1.png"])))
        store.record_outcome(record(key="k1", paths=["images/j/0-k1.png"]))
        store.journal("attempt_started", idempotency_key="k2", attempt=1)
        store.append_usage({"idempotency_key": "k1", "attempt": 1, "route": "r", "model": "m"})
        before = journal_objects(store.backend.list("journal/"))  # type: ignore[attr-defined]
        assert len(before) == 3  # one PUT per synced line here (one thread): started, answered, started
        states = store.load_state()
        store.backend.sync()  # the end of a run: the rest committed, then compacted
        after = store.backend.list("journal/")  # type: ignore[attr-defined]
    assert states["k1"].status == "succeeded" and states["k2"].status == "unknown"
    assert after == ["journal/00000001-compact.jsonl"]
    again = OutputStore(url)
    replayed = again.load_state()
    assert replayed["k1"].status == "succeeded" and replayed["k2"].status == "unknown"
    assert [u["attempt"] for u in again.usage_lines()] == [1]
    with again.backend.hold():  # the next run's segments sort after the compaction
        again.journal("attempt_started", idempotency_key="k3", attempt=1)
        assert again.backend.list("journal/")[-1].startswith("journal/00000002-")  # type: ignore[attr-defined]
    assert again.load_state()["k3"].status == "unknown"


def test_group_commit_shares_one_put_between_threads(s3: Any) -> None:
    store = OutputStore(f"s3://{s3.bucket()}/g")
    with store.backend.hold():
        assert store.backend.segments is not None
        barrier = threading.Barrier(16)

        def one(i: int) -> None:
            barrier.wait()
            store.journal("attempt_started", idempotency_key=f"k{i}", attempt=1)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        puts = store.backend.segments.puts
    assert 1 <= puts < 16
    assert len(store.load_state()) == 16
