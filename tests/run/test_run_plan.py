"""`run.plan`: the run's plan as a stream planned again on each pass (`RunPlan`), its units made as the
requests come (`group_units`), their variants added unit by unit (`work.variants.Variants`); over real
manifests and a real folder."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from helpers.runs import write_jsonl

from imagebatch.manifest import Job, PlannedRequest, load_manifest, plan, variant_of
from imagebatch.run.plan import RunPlan
from imagebatch.work.context import Decision, decide, group_units, sends
from imagebatch.work.records import record
from imagebatch.work.store import KeyState, OutputStore
from imagebatch.work.variants import Variants


class CountedJobs:
    """A manifest's jobs that count how often they are iterated (a pass of the plan is one)."""

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs, self.passes = jobs, 0

    def __iter__(self) -> Iterator[Job]:
        self.passes += 1
        return iter(self.jobs)


@pytest.fixture
def jobs(tmp_path: Path) -> CountedJobs:
    rows = [
        {"id": "a", "prompt": "a mug", "model": "native-image-2", "count": 2},
        {"id": "b", "prompt": "a cup", "model": "native-image-2", "turns": ["warmer", "brighter"]},
        {"id": "c", "prompt": "a jug", "model": "native-image-2"},
    ]
    return CountedJobs(list(load_manifest(write_jsonl(tmp_path / "m.jsonl", rows)).jobs))


def shape(units: object) -> list[tuple[int, str, int]]:
    return [(u.index, u.name, len(u.requests)) for u in units]  # type: ignore[attr-defined]


def test_a_run_plan_makes_the_same_units_again_from_the_jobs_on_every_pass(jobs: CountedJobs) -> None:
    run_plan = RunPlan(jobs)
    run_plan.count()
    assert (run_plan.units, run_plan.requests, jobs.passes) == (4, 6, 1)  # b's chain: one unit, 3 turns
    first, second = shape(run_plan), shape(run_plan)
    assert jobs.passes == 3
    assert first == second == [(0, "a#0", 1), (1, "a#1", 1), (2, "b#0", 3), (3, "c#0", 1)]


def test_units_are_made_as_the_requests_come_holding_one_unit_at_a_time(jobs: CountedJobs) -> None:
    pulled: list[PlannedRequest] = []

    def requests() -> Iterator[PlannedRequest]:
        for req in plan(jobs):
            pulled.append(req)
            yield req

    units = group_units(requests())
    assert next(units).name == "a#0" and len(pulled) == 2  # a#1's request shows a#0 is whole
    assert next(units).name == "a#1" and len(pulled) == 3
    chain = next(units)
    assert [r.turn_index for r in chain.requests] == [0, 1, 2] and len(pulled) == 6


def test_a_plan_s_variants_come_before_their_request_numbered_in_order_and_held(
    jobs: CountedJobs, tmp_path: Path
) -> None:
    """The journal knows variants 2 and 3 of a#1: they come first, newest first, and a run that is not
    a redo holds them (sends none); the other units are renumbered after them, the same on each pass."""
    a1 = next(r for r in plan(jobs) if (r.job_id, r.request_index) == ("a", 1))
    states = {a1.idempotency_key: KeyState(outcome=record(a1, "succeeded"))}
    for n in (2, 3):
        v = variant_of(a1, n)
        states[v.idempotency_key] = KeyState(outcome=record(v, "failed"), variant=n, request=("a", 1, 0))
    variants = Variants(states, OutputStore(tmp_path / "out"))
    run_plan = RunPlan(jobs)
    run_plan.count(variants)
    expected = [(0, "a#0", 1), (1, "a#1 v3", 1), (2, "a#1 v2", 1), (3, "a#1", 1)]
    expected += [(4, "b#0", 3), (5, "c#0", 1)]
    assert shape(run_plan) == shape(run_plan) == expected
    assert (run_plan.units, run_plan.requests) == (6, 8)
    assert variants.held == {variant_of(a1, 2).idempotency_key, variant_of(a1, 3).idempotency_key}
    assert variants.summary is None  # not a redo run


def test_the_counting_pass_counts_the_units_to_send_with_the_variants_it_holds_as_it_goes(
    jobs: CountedJobs, tmp_path: Path
) -> None:
    """The units to send (the dispatcher's batches are sized by them) are counted in the pass that finds
    the variants: a failed variant outside a redo is held as soon as its request is reached, before its
    unit comes, so it is not counted; a#1 succeeded; a#0, b#0 and c#0 were never sent."""
    a1 = next(r for r in plan(jobs) if (r.job_id, r.request_index) == ("a", 1))
    states = {a1.idempotency_key: KeyState(outcome=record(a1, "succeeded"))}
    for n in (2, 3):
        v = variant_of(a1, n)
        states[v.idempotency_key] = KeyState(outcome=record(v, "failed"), variant=n, request=("a", 1, 0))
    variants = Variants(states, OutputStore(tmp_path / "out"))

    def decision(key: str) -> Decision:
        return decide(states.get(key), held=variants.holds(key))

    run_plan, passes = RunPlan(jobs), jobs.passes
    run_plan.count(variants, partial(sends, decision=decision))
    assert (run_plan.units, run_plan.to_send, jobs.passes - passes) == (6, 3, 1)
    assert [u.name for u in run_plan if sends(u, decision)] == ["a#0", "b#0", "c#0"]
    assert not variants.holds(a1.idempotency_key)
    assert all(variants.holds(variant_of(a1, n).idempotency_key) for n in (2, 3))


def test_a_shard_s_plan_keeps_its_own_units_with_the_whole_plan_s_numbers(jobs: CountedJobs) -> None:
    run_plan = RunPlan(jobs, keep=lambda unit: unit.job.id != "a")
    run_plan.count()
    assert shape(run_plan) == [(2, "b#0", 3), (3, "c#0", 1)]
    assert (run_plan.units, run_plan.requests) == (2, 4)
