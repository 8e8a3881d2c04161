"""`run.shards`' plan of a sharded run, without Prefect: which shards have something to send, and the
parameters of those alone (the runs themselves: tests/platform/test_deploy_shards.py)."""

from __future__ import annotations

from helpers.units import planned_units

from imagebatch.options import RunOptions
from imagebatch.run.shards import requests_to_send, shard_of, shard_parameters
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
