"""Issue 30 #1 on real Prefect components: a run whose machine died (`kill -9` of its worker and its flow
process) is Crashed by the heartbeat automation within its window even when `imagebatch deploy` runs
right after the kill (an update of the automation would restart the window), and its deployment's slot
is free again. A `prefect server start` on SQLite, a process pool, a plain `prefect worker start`, and
the emulator over HTTP; every wait is for an event, bounded."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.prefect_server import (
    PrefectServer,
    call,
    kill_machine,
    running_prefect_server,
    start_worker,
    stop_process_group,
    wait_for,
)

from imagebatch.cli.main import main
from imagebatch.gateway.emulator import EmulatorServer, EmulatorSettings
from imagebatch.platform.automations import AUTOMATION_NAME, PENDING_NAME, WINDOW_SECONDS

pytestmark = pytest.mark.slow  # its own Prefect servers and workers

POOL = "dead-runs-pool"
KEY = "sk-dead-runs-test-key"


@pytest.fixture(scope="module", autouse=True)
def prefect_harness() -> None:
    """Overrides the session harness: everything here talks to the server below."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    with running_prefect_server(tmp_path_factory.mktemp("dead-runs"), stop_grace=3) as running:
        from prefect.workers.process import ProcessWorker

        body = {
            "name": POOL,
            "type": "process",
            "base_job_template": ProcessWorker.get_default_base_job_template(),
        }
        httpx.post(f"{running.api_url}/work_pools/", json=body, timeout=30).raise_for_status()
        yield running


def deploy(server: PrefectServer, args: str) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: server.api_url}):
        assert main(["deploy", *shlex.split(args)]) == 0


def automations(server: PrefectServer) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in call(server, "POST", "/automations/filter", {})}


def heartbeats(server: PrefectServer, flow_run_id: str) -> int:
    body = {"filter": {"event": {"name": ["prefect.flow-run.heartbeat"]},
                       "resource": {"id": [f"prefect.flow-run.{flow_run_id}"]}}}  # fmt: skip
    return int(call(server, "POST", "/events/filter", body)["total"])


def test_a_run_killed_then_redeployed_is_crashed_within_the_window_and_frees_its_slot(
    server: PrefectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("IMAGEBATCH_HEARTBEAT_WINDOW", raising=False)  # the default window
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,prompt\n" + "".join(f"k{i:03d},item {i}\n" for i in range(40)))
    with EmulatorServer(EmulatorSettings(api_key=KEY, seed=0, jpeg_rate=0.0, latency=1.0)) as emulator:
        args = (
            f"{manifest} --out {tmp_path / 'out'} --name killed --work-pool {POOL} --base-url {emulator.url}"
        )
        deploy(server, f"{args} --concurrency 1 --no-adaptive")
        watch = automations(server)
        assert {AUTOMATION_NAME, PENDING_NAME} <= set(watch)
        deployment = call(server, "GET", "/deployments/name/generate_from_manifest/killed")
        env = {"IMAGEBATCH_API_KEY": KEY, "PREFECT_HOME": str(tmp_path / "w")}
        worker = start_worker(server.api_url, POOL, env, tmp_path / "worker.log")
        try:
            run_id = str(call(server, "POST", f"/deployments/{deployment['id']}/create_flow_run", {})["id"])
            wait_for("the run's first heartbeat", lambda: heartbeats(server, run_id), 180)
            wait_for("a request sent", lambda: emulator.requests(), 120)
            assert kill_machine(worker, {run_id}) == 1
            killed_at = time.monotonic()
        finally:
            stop_process_group(worker, grace=1)
        deploy(server, f"{args} --concurrency 1 --no-adaptive")  # at once: well within the window
        after = automations(server)
        for name in (AUTOMATION_NAME, PENDING_NAME):  # not updated: its window goes on
            assert after[name]["updated"] == watch[name]["updated"], name

        def crashed() -> dict[str, Any] | None:
            run = call(server, "GET", f"/flow_runs/{run_id}")
            return run if run["state_type"] != "RUNNING" else None

        run = wait_for("the killed run Crashed", crashed, WINDOW_SECONDS + 120)
        took = time.monotonic() - killed_at
        assert run["state_type"] == "CRASHED" and "no heartbeat" in run["state"]["message"], run["state"]
        assert took < WINDOW_SECONDS + 35, took  # the window, the server's evaluation loop, a last heartbeat
        slots = call(server, "GET", f"/deployments/{deployment['id']}")["global_concurrency_limit"]
        assert slots["limit"] == 1 and slots["active_slots"] == 0, slots


def test_deploy_creates_the_automations_once_and_updates_them_only_when_they_differ(
    server: PrefectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = f"{tmp_path / 'm.csv'} --out {tmp_path / 'out'} --name same --work-pool {POOL} --base-url embedded"
    (tmp_path / "m.csv").write_text("id,prompt\na,one\n")
    deploy(server, args)
    first = automations(server)
    deploy(server, args)
    assert automations(server) == first  # the same, not even rewritten
    monkeypatch.setenv("IMAGEBATCH_HEARTBEAT_WINDOW", "120")
    deploy(server, args)
    changed = automations(server)
    assert changed[AUTOMATION_NAME]["trigger"]["within"] == 120.0
    assert changed[AUTOMATION_NAME]["id"] == first[AUTOMATION_NAME]["id"]
    assert changed[PENDING_NAME] == first[PENDING_NAME]
