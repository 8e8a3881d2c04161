"""Issue 30 #1 on real Prefect components: a run whose machine died (`kill -9` of its worker and its flow
process) is Crashed by the heartbeat automation within its window even when `imagebatch deploy` runs
right after the kill (an update of the automation would restart the window), and its deployment's slot
is free again, so the next run sends only the rest. A `prefect server start` on SQLite, a process pool, a
plain `prefect worker start`, and the emulator over HTTP; every wait is for an event, bounded."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.prefect_server import (
    PrefectServer,
    call,
    kill_machine,
    prefect_api,
    running_worker,
    start_worker,
    stop_process_group,
    wait_for,
)
from helpers.runs import Gate
from helpers.shared_servers import PrefectServers

from imagebatch.cli.main import main
from imagebatch.emulator import EmulatorServer, EmulatorSettings
from imagebatch.platform.automations import AUTOMATION_NAME, PENDING_NAME

pytestmark = pytest.mark.slow  # Prefect servers (helpers.shared_servers) and workers

POOL = "dead-runs-pool"
KEY = "sk-dead-runs-test-key"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@pytest.fixture(scope="module", autouse=True)
def prefect_harness() -> None:
    """Overrides the session harness: everything here talks to the server below."""


@pytest.fixture(scope="module")
def server(prefect_servers: PrefectServers) -> PrefectServer:
    return prefect_servers.sqlite(POOL)


def deploy(server: PrefectServer, args: str) -> None:
    with prefect_api(server.api_url):
        assert main(["deploy", *shlex.split(args)]) == 0


def automations(server: PrefectServer) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in call(server, "POST", "/automations/filter", {})}


def start_run(server: PrefectServer, deployment_id: str) -> str:
    return str(call(server, "POST", f"/deployments/{deployment_id}/create_flow_run", {})["id"])


def heartbeats(server: PrefectServer, flow_run_id: str) -> int:
    body = {"filter": {"event": {"name": ["prefect.flow-run.heartbeat"]},
                       "resource": {"id": [f"prefect.flow-run.{flow_run_id}"]}}}  # fmt: skip
    return int(call(server, "POST", "/events/filter", body)["total"])


def test_a_run_killed_then_redeployed_is_crashed_within_the_window_and_the_next_run_sends_only_the_rest(
    server: PrefectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kill -9` of the worker and its flow run mid-run, then `imagebatch deploy` at once: the automation
    is not rewritten (its window goes on), the run is Crashed within the window (45 s here, the least above
    the 30 s heartbeat), its deployment's slot is free, and the next run starts (not Cancelled) and sends
    only what the killed one had not sent (issue 20, item 4), counted in the emulator's request log."""
    from collections import Counter

    window = 45.0
    monkeypatch.setenv("IMAGEBATCH_HEARTBEAT_WINDOW", f"{window:g}")  # for both deploys: no update between
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,prompt\n" + "".join(f"k{i:03d},item {i}\n" for i in range(20)))
    out = tmp_path / "out"
    env = {"IMAGEBATCH_API_KEY": KEY, "PREFECT_HOME": str(tmp_path / "w")}
    gate = Gate(4)  # four answered, the next held in flight until the kill: the run is mid-send then
    settings = EmulatorSettings(api_key=KEY, seed=0, jpeg_rate=0.0, latency=1.0, sleep=gate)
    with EmulatorServer(settings) as emulator:
        args = f"{manifest} --out {out} --name killed --work-pool {POOL} --base-url {emulator.url}"
        deploy(server, f"{args} --concurrency 2 --no-adaptive")
        watch = automations(server)
        assert {AUTOMATION_NAME, PENDING_NAME} <= set(watch)
        assert watch[AUTOMATION_NAME]["trigger"]["within"] == window
        deployment = call(server, "GET", "/deployments/name/generate_from_manifest/killed")
        run_id, killed_at = _killed_mid_run(server, gate, deployment["id"], env, tmp_path / "worker.log")
        sent_before = Counter(r["idempotency_key"] for r in emulator.requests())
        deploy(server, f"{args} --concurrency 2 --no-adaptive")  # at once: well within the window
        after = automations(server)
        for name in (AUTOMATION_NAME, PENDING_NAME):  # not updated: its window goes on
            assert after[name]["updated"] == watch[name]["updated"], name

        def crashed() -> dict[str, Any] | None:
            run = call(server, "GET", f"/flow_runs/{run_id}")
            return run if run["state_type"] != "RUNNING" else None

        run = wait_for("the killed run Crashed", crashed, window + 120)
        took = time.monotonic() - killed_at
        assert run["state_type"] == "CRASHED" and "no heartbeat" in run["state"]["message"], run["state"]
        assert took < window + 35, took  # the window, the server's evaluation loop, a last heartbeat
        slots = call(server, "GET", f"/deployments/{deployment['id']}")["global_concurrency_limit"]
        assert slots["limit"] == 1 and slots["active_slots"] == 0, slots

        with running_worker(server.api_url, POOL, env, tmp_path / "worker2.log", stop_grace=3):
            second_id = start_run(server, deployment["id"])

            def ended() -> dict[str, Any] | None:
                run = call(server, "GET", f"/flow_runs/{second_id}")
                return run if run["state_type"] in TERMINAL else None

            second = wait_for("the next run's end", ended, 180, log=tmp_path / "worker2.log")
    _the_next_run_sent_only_the_rest(second, emulator.requests(), len(sent_before), out, 20)


def _killed_mid_run(
    server: PrefectServer, gate: Gate, deployment_id: str, env: dict[str, str], log: Path
) -> tuple[str, float]:
    """A worker starts a run of the deployment; once four requests are answered and the next is held in
    flight (`gate`), the worker and the run are killed (`kill -9`, as a machine dies); the gate then opens.
    Returns the run's id and when it was killed."""
    worker = start_worker(server.api_url, POOL, env, log)
    try:
        run_id = start_run(server, deployment_id)
        wait_for("the run's first heartbeat", lambda: heartbeats(server, run_id), 180)
        assert gate.closed_on_someone.wait(timeout=120), "no request held after the first four"
        assert kill_machine(worker, {run_id}) == 1
        return run_id, time.monotonic()
    finally:
        gate.release.set()
        stop_process_group(worker, grace=1)


def _the_next_run_sent_only_the_rest(
    second: dict[str, Any], requests: list[dict[str, Any]], sent_before: int, out: Path, rows_expected: int
) -> None:
    """Not cancelled by a zombie's slot: the run ran to its own verdict (run.final_state), which is Failed
    only for the requests the killed run left `unknown` (sent, never answered; not resent). Each key was
    sent once, and every key reached the service but unknown ones, which may not have (killed before
    their bytes left)."""
    from collections import Counter

    from helpers.runs import read_results

    assert second["state_type"] in ("COMPLETED", "FAILED"), second["state"]
    assert second["state"]["message"].startswith("imagebatch: "), second["state"]
    sent = Counter(r["idempotency_key"] for r in requests)
    assert set(sent.values()) == {1}  # nothing sent twice
    assert len(sent) > sent_before  # the rest, and only the rest (each key once, above)
    rows = read_results(out)
    statuses = Counter(r["status"] for r in rows)
    assert statuses["unknown"] + statuses["succeeded"] + statuses["skipped"] == rows_expected
    assert (second["state_type"] == "COMPLETED") == (statuses["unknown"] == 0)
    unknown = {r["idempotency_key"] for r in rows if r["status"] == "unknown"}
    assert {r["idempotency_key"] for r in rows} - set(sent) <= unknown


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
