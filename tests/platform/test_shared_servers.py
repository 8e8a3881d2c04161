"""The Prefect server the platform modules of a test process share (`helpers.shared_servers`): the next
module finds it empty of everything the previous one made through the API."""

from __future__ import annotations

import pytest
from helpers.prefect_server import api_call, prefect_api
from helpers.shared_servers import MADE, PrefectServers

pytestmark = pytest.mark.slow  # a Prefect server


def _make_one_of_each(api: str) -> None:
    from prefect.blocks.system import Secret

    flow = api_call(api, "POST", "/flows/", {"name": "shared-servers-flow"})
    deployment = api_call(
        api, "POST", "/deployments/", {"name": "d", "flow_id": flow["id"], "work_pool_name": "made-pool"}
    )
    api_call(api, "POST", f"/deployments/{deployment['id']}/create_flow_run", {})
    api_call(api, "POST", "/automations/", {
        "name": "a", "actions": [{"type": "do-nothing"}],
        "trigger": {"type": "event", "posture": "Reactive", "expect": ["x"], "threshold": 1, "within": 0},
    })  # fmt: skip
    api_call(api, "POST", "/v2/concurrency_limits/", {"name": "l", "limit": 1})
    api_call(api, "POST", "/concurrency_limits/", {"tag": "t", "concurrency_limit": 1})
    api_call(api, "POST", "/variables/", {"name": "v", "value": "x"})
    api_call(api, "POST", "/artifacts/", {"key": "k", "type": "markdown", "data": "x"})
    with prefect_api(api):
        Secret(value="not-a-real-secret").save("made-secret")


def test_the_next_module_finds_the_same_server_empty(prefect_servers: PrefectServers) -> None:
    server = prefect_servers.sqlite("made-pool")
    _make_one_of_each(server.api_url)
    made = {listing: api_call(server.api_url, "POST", listing, {}) for listing, _, _ in MADE}
    assert all(made.values()), made  # one of each kind is listed...
    starts = prefect_servers.starts

    again = prefect_servers.sqlite("next-pool")

    assert again == server and prefect_servers.starts == starts  # the same process, not started again
    left = {listing: api_call(server.api_url, "POST", listing, {}) for listing, _, _ in MADE}
    pools = left.pop("/work_pools/filter")
    assert [p["name"] for p in pools] == ["next-pool"] and not any(left.values()), left  # ...and none after
