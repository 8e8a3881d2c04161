"""`run.shards`' plan of a sharded run, without Prefect: which shards have something to send, and the
parameters of those alone (the runs themselves: tests/platform/test_deploy_shards*.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.units import planned_units

from imagebatch.manifest import ManifestError, load_manifest, plan, variant_of
from imagebatch.options import RunOptions
from imagebatch.run.shards import requests_to_send, shard_keeps, shard_of, shard_parameters
from imagebatch.work.context import Unit, group_units
from imagebatch.work.replay import KeyState


def test_a_shard_whose_requests_are_all_settled_is_not_started_and_the_budget_goes_to_the_others() -> None:
    units = planned_units(30)
    options = RunOptions.from_flat(shards=3, max_images=9)
    # Shard 1's requests were sent and never answered (`unknown`): not sent again unless asked.
    before = {
        r.idempotency_key: KeyState(pending=True) for u in units if shard_of(u, 3) == 1 for r in u.requests
    }
    to_send = requests_to_send(options, units, before, frozenset())
    assert to_send[1] == 0 and to_send[0] > 0 and to_send[2] > 0 and sum(to_send) == 30 - len(before)
    parameters = shard_parameters("m.csv", "/out", options, to_send)
    assert sorted(parameters) == [0, 2]
    assert [parameters[i]["role"]["shard"] for i in (0, 2)] == [0, 2]
    assert (
        sum(RunOptions.model_validate(p["options"]).budgets.max_images or 0 for p in parameters.values()) == 9
    )

    retried = RunOptions.from_flat(shards=3, retry_unknown=True)  # asked: shard 1 has them to send again
    assert requests_to_send(retried, units, before, frozenset())[1] == len(before)
    assert shard_parameters("m.csv", "/out", options, [0, 0, 0]) == {}  # nothing to send: no shard at all


def _chains_and_copies(path: Path) -> Path:
    """A JSON manifest of single requests, copies (`count`) and chains (`turns`)."""
    jobs: list[dict[str, Any]] = []
    for i in range(90):
        job: dict[str, Any] = {"id": f"sku-{i:03d}", "prompt": f"a mug, number {i}", "count": 1 + i % 3}
        if i % 5 == 0:
            job["turns"] = ["warmer", "on white"]
        jobs.append(job)
    path.write_text(json.dumps(jobs))
    return path


def test_a_shard_reads_only_the_jobs_it_sends_and_plans_the_same_units(tmp_path: Path) -> None:
    path = _chains_and_copies(tmp_path / "m.json")
    whole = list(group_units(plan(load_manifest(path))))
    sent: list[str] = []
    for shard in range(3):
        own = load_manifest(path, keep=shard_keeps(shard, 3))
        expected = [u for u in whole if shard_of(u, 3) == shard]
        assert [job.id for job in own.jobs] == list(dict.fromkeys(u.job.id for u in expected))
        units = [u for u in group_units(plan(own)) if shard_of(u, 3) == shard]
        keys = [[r.idempotency_key for r in u.requests] for u in units]
        assert keys == [[r.idempotency_key for r in u.requests] for u in expected]
        sent += [k for unit in keys for k in unit]
    assert sorted(sent) == sorted(r.idempotency_key for u in whole for r in u.requests)  # each once
    assert 1 < len(load_manifest(path, keep=shard_keeps(0, 3)).jobs) < 90


def test_every_sample_of_a_request_goes_to_its_first_samples_shard(tmp_path: Path) -> None:
    units = list(group_units(plan(load_manifest(_chains_and_copies(tmp_path / "m.json")))))
    for unit in units:
        for turn in unit.requests:
            later = variant_of(turn, 2)
            alone = Unit(len(units), unit.job, [later])
            assert later.idempotency_key != unit.requests[0].idempotency_key
            assert shard_of(alone, 7) == shard_of(unit, 7)


def test_a_shard_refuses_a_manifest_for_a_row_it_does_not_keep(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id,prompt,count\nsku-1,a mug,1\nsku-2,a mug,0\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(path, keep=lambda job: False)
    assert [(p.line, p.field) for p in info.value.problems] == [(3, "count")]
    path.write_text("id,prompt,count\nsku-1,a mug,1\nsku-2,a mug,2\n")
    assert [job.id for job in load_manifest(path, keep=lambda job: job.count == 2).jobs] == ["sku-2"]
