"""Issue 30 #2 on real Prefect components: SIGTERM to `imagebatch worker --limit 1` running a two-shard
run stops the whole run. The parent (the worker's one flow run) runs shard 0 in its own child process
and shard 1 waits for a worker; after the signal nothing more is sent, what was in flight is recorded,
the shard no worker had started is Cancelled (no worker runs it later), and the parent ends Cancelled
with results.csv and run.json "stopped" written from what the shard recorded.

A `prefect server start` (SQLite), a process pool and the emulator over HTTP; every wait is for an
event, bounded."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers.prefect_server import (
    PrefectServer,
    base_environment,
    call,
    prefect_api,
    stop_process_group,
    wait_for,
)
from helpers.runs import read_results
from helpers.shared_servers import PrefectServers

from imagebatch.cli.main import main
from imagebatch.emulator import EmulatorServer, EmulatorSettings

pytestmark = pytest.mark.slow  # Prefect servers (helpers.shared_servers) and workers

POOL = "sharded-stop-pool"
KEY = "sk-sharded-stop-test-key"
ROWS = 40
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@pytest.fixture(scope="module", autouse=True)
def prefect_harness() -> None:
    """Overrides the session harness: everything here talks to the server below."""


@pytest.fixture(scope="module")
def server(prefect_servers: PrefectServers) -> PrefectServer:
    return prefect_servers.sqlite(POOL)


def imagebatch_worker(server: PrefectServer, home: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {"IMAGEBATCH_API_KEY": KEY, "PREFECT_HOME": str(home), "PREFECT_API_URL": server.api_url,
           "PREFECT_WORKER_QUERY_SECONDS": "1"}  # fmt: skip
    command = [sys.executable, "-m", "imagebatch.cli.main", "worker", "--pool", POOL, "--limit", "1"]
    with open(log, "ab") as out:
        return subprocess.Popen(
            command, env=base_environment(env), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def test_sigterm_to_the_worker_stops_every_shard_and_records_the_run_stopped(
    server: PrefectServer, tmp_path: Path
) -> None:

    manifest = tmp_path / "m.csv"
    manifest.write_text("id,prompt\n" + "".join(f"s{i:03d},item {i}\n" for i in range(ROWS)))
    out, log = tmp_path / "out", tmp_path / "worker.log"
    with EmulatorServer(EmulatorSettings(api_key=KEY, seed=0, jpeg_rate=0.0, latency=1.0)) as emulator:
        args = (
            f"{manifest} --out {out} --name split --work-pool {POOL} --shards 2 --concurrency 2 "
            f"--no-adaptive --base-url {emulator.url}"
        )
        with prefect_api(server.api_url):
            assert main(["deploy", *shlex.split(args)]) == 0
        deployment = call(server, "GET", "/deployments/name/generate_from_manifest/split")
        worker = imagebatch_worker(server, tmp_path / "home", log)
        try:
            parent_id = str(
                call(server, "POST", f"/deployments/{deployment['id']}/create_flow_run", {})["id"]
            )
            wait_for("4 requests sent", lambda: len(emulator.requests()) >= 4, 240, log)
            signalled = time.time()
            os.kill(worker.pid, signal.SIGTERM)  # what `docker stop` sends the container's first process
            assert worker.wait(timeout=180) == 0, log.read_text(errors="replace")[-4000:]
        finally:
            stop_process_group(worker, grace=3)
        parent = call(server, "GET", f"/flow_runs/{parent_id}")
        sent = emulator.requests()

    assert parent["state_type"] == "CANCELLED", parent["state"]
    late = [r for r in sent if r["time"] > signalled + 5]
    assert not late, f"{len(late)} request(s) sent more than 5 s after the SIGTERM"
    summary = json.loads((out / "run.json").read_text())
    assert summary["state"] == "stopped" and summary["stopped"].startswith("interrupted (SIGTERM)"), summary
    rows = read_results(out)
    assert len(rows) == ROWS
    statuses = Counter(r["status"] for r in rows)
    seen = {r["idempotency_key"] for r in sent}
    assert {r["idempotency_key"] for r in rows if r["status"] == "succeeded"} == seen  # in flight: recorded
    assert statuses == {"succeeded": len(seen), "not_attempted": ROWS - len(seen)}, statuses

    query = {"flow_runs": {"parent_task_run_id": {"is_null_": False}},
             "deployments": {"name": {"any_": ["split-shards"]}}}  # fmt: skip
    shards = {r["name"]: r for r in call(server, "POST", "/flow_runs/filter", query)}
    assert set(shards) == {"shard 0-of-2", "shard 1-of-2"}, shards
    assert {name: r["state_type"] for name, r in shards.items()} == {
        "shard 0-of-2": "CANCELLED",  # the parent's own child: its graceful stop
        "shard 1-of-2": "CANCELLED",  # never started: no worker runs it later
    }
    history = call(server, "GET", f"/flow_run_states/?flow_run_id={shards['shard 1-of-2']['id']}")
    assert "RUNNING" not in {state["type"] for state in history}, history
