"""Batched dispatch (issue 9): Prefect records one task run per batch of units, not per request, while the
run's one limit on requests in flight is shared by every batch, so the tail of one batch never idles a
slot; every request keeps its own key, journal lines and record. The window on requests in flight that
adapts to 429s."""

from __future__ import annotations

import gc
import math
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

from helpers.runs import Rendezvous, catalog, peak_in_flight, read_jsonl, read_results, run_now

from imagebatch.run.batches import Batch, batch_size, cut_batches
from imagebatch.run.dispatch import Window
from imagebatch.work.context import Unit


def task_run_names(flow_run_id: str) -> list[str]:
    """The names of a flow run's task runs, as Prefect's server recorded them."""
    from prefect.client.orchestration import get_client

    body = {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200, "sort": "NAME_ASC"}
    with get_client(sync_client=True) as client:
        return [run["name"] for run in client.request("POST", "/task_runs/filter", json=body).json()]


def test_batch_size_is_one_for_small_runs_and_bounded_for_large_ones() -> None:
    assert [batch_size(n) for n in (0, 1, 100, 101, 250, 10_000, 100_000, 1_000_000)] == [
        1, 1, 1, 2, 3, 100, 1000, 1000,
    ]  # fmt: skip


def test_batches_cut_units_in_order_and_keep_every_unit_once() -> None:
    units = [Unit(i, None, []) for i in range(250)]  # type: ignore[arg-type]
    batches = list(cut_batches(iter(units), batch_size(len(units))))
    assert len(batches) == 84 and [len(b.units) for b in batches][-2:] == [3, 1]
    assert [u.index for b in batches for u in b.units] == list(range(250))
    assert [b.index for b in batches] == list(range(84))


def test_a_batch_yields_what_was_admitted_until_closed_and_gives_back_what_nobody_took() -> None:
    units = [Unit(i, None, []) for i in range(3)]  # type: ignore[arg-type]
    batch = Batch(0, units)
    batch.admit(units[0])
    batch.admit(units[1])
    batch.close()
    batch.close()  # closing twice is harmless
    assert [u.index for u in batch] == [0, 1]
    other = Batch(1, units)
    other.admit(units[2])
    assert [u.index for u in other.untaken()] == [2]


def test_a_large_run_records_one_task_run_per_batch_and_shares_its_slots(
    service_env: Any, tmp_path: Path, out: Path
) -> None:
    rows, concurrency = 250, 8  # 84 batches of at most 3 units: wider than one batch
    service_env.configure(latency=0.03, sleep=Rendezvous(batch_size(rows) + 1))
    info = run_now(catalog(tmp_path / "m.csv", rows, "sku-"), out, concurrency=concurrency, adaptive=False)

    assert info["counts"]["succeeded"] == rows
    keys = Counter(r["idempotency_key"] for r in service_env.requests())
    assert len(keys) == rows and set(keys.values()) == {1}  # each request sent once, with its own key
    assert {r["idempotency_key"] for r in read_results(out)} == set(keys)
    started = Counter(
        e["idempotency_key"] for e in read_jsonl(out / "journal.jsonl") if e["event"] == "attempt_started"
    )
    assert started == keys  # every request journaled before it was sent, as before

    batches = math.ceil(rows / batch_size(rows))
    assert info["prefect"]["task_runs"] == batches
    names = task_run_names(info["prefect"]["flow_run_id"])
    assert len(names) == batches
    assert "sku-0000#0 .. sku-0002#0 (3)" in names
    # One limit for the whole run: more requests in flight than one batch holds, never more than asked.
    assert batch_size(rows) < peak_in_flight(service_env.requests()) <= concurrency


def test_the_dispatcher_lets_go_of_each_batch_once_its_task_run_has_ended(
    service_env: Any, tmp_path: Path, out: Path, monkeypatch: Any
) -> None:
    """A future keeps its done-callbacks, and so its batch and the batch's units: holding every task run's
    future to the end held every unit of the run (a whole run's memory grew with its size). Each time a
    batch is cut, the batches still alive must be the ones whose task run has not ended (or whose end is
    queued), the one being admitted and the next one."""
    from imagebatch.run import dispatch

    live: weakref.WeakSet[Batch] = weakref.WeakSet()
    dispatchers: list[dispatch.Dispatcher] = []
    over: list[tuple[int, int]] = []
    cut, run = dispatch.cut_batches, dispatch.Dispatcher.run

    def tracked(units: Any, size: int) -> Any:
        for batch in cut(units, size):
            d = dispatchers[-1]
            # + the batch being admitted, the next one, one put back by a budget, the last ended one taken
            bound = len(d.running) + d.finished.qsize() + 4
            if len(live) > bound:
                gc.collect()  # only what a cycle keeps is left to the collector
                if len(live) > bound:
                    over.append((len(live), bound))
            live.add(batch)
            yield batch

    def running(self: dispatch.Dispatcher) -> int:
        dispatchers.append(self)
        return run(self)

    monkeypatch.setattr(dispatch, "cut_batches", tracked)
    monkeypatch.setattr(dispatch.Dispatcher, "run", running)
    # Batches of 2 units (`batch_size`): 51 task runs. A run that keeps every batch is caught from about
    # its ninth (alive 9 against a bound of 7), as it was with 300 rows in batches of 3.
    rows = 101
    info = run_now(catalog(tmp_path / "m.csv", rows, "sku-"), out, concurrency=4, adaptive=False)

    assert info["counts"]["succeeded"] == rows
    assert info["prefect"]["task_runs"] == math.ceil(rows / batch_size(rows))
    assert not over, f"batches kept alive past their task run (alive, bound): {over[:5]}"


def test_a_small_run_keeps_one_task_run_per_request(service_env: Any, tmp_path: Path) -> None:
    info = run_now(catalog(tmp_path / "m.csv", 5, "sku-"), tmp_path / "out")
    assert task_run_names(info["prefect"]["flow_run_id"]) == [f"sku-{i:04d}#0" for i in range(5)]


def test_shards_split_the_units_disjointly_and_alike_on_every_machine(tmp_path: Path) -> None:
    from imagebatch.manifest import load_manifest, plan
    from imagebatch.run.shards import shard_of
    from imagebatch.work.context import group_units

    units = list(group_units(plan(load_manifest(catalog(tmp_path / "m.csv", 300, "sku-")))))
    split = [[u.index for u in units if shard_of(u, 3) == i] for i in range(3)]
    assert sorted(i for part in split for i in part) == list(range(300))  # each unit in exactly one shard
    assert all(60 < len(part) < 140 for part in split)  # and about evenly
    again = list(group_units(plan(load_manifest(tmp_path / "m.csv"))))
    assert [[u.index for u in again if shard_of(u, 3) == i] for i in range(3)] == split


def test_the_dispatcher_gives_freed_memory_back_every_so_many_requests(monkeypatch: Any) -> None:
    from imagebatch.run import dispatch
    from imagebatch.work.store import RequestRecord

    trims: list[int] = []
    monkeypatch.setattr(dispatch, "TRIM_EVERY", 3)
    monkeypatch.setattr(dispatch, "release_free_memory", lambda: trims.append(progress.counts.total()))
    record = RequestRecord("j", 0, 0, "succeeded", "m", "native", "k")
    progress = dispatch.Progress(6, None)
    for records in ([record], [record, record], [record], [record], [record]):
        progress.finished(records)
    assert trims == [3, 6]  # after the unit that reached 3 requests, and 6


def test_the_window_starts_low_doubles_then_halves_once_per_overshoot() -> None:
    window = Window(32)
    assert window.size == 4
    for _ in range(4):
        window.finished(rate_limited=False)
    assert window.size == 8  # slow start: one more per unit finished, a doubling per round
    window.finished(rate_limited=True)
    assert window.size == 4
    window.finished(rate_limited=True)  # the same overshoot's other 429s do not cut again
    assert window.size == 4
    for _ in range(8):
        window.finished(rate_limited=False)
    assert window.size == 5  # then one more per two windows without a 429
    for _ in range(1000):
        window.finished(rate_limited=False)
    assert window.size == 32  # never above --concurrency


def test_a_window_that_does_not_adapt_opens_every_slot() -> None:
    window = Window(32, adaptive=False)
    window.finished(rate_limited=True)
    assert window.size == 32
