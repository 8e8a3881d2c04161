"""`imagebatch deploy` against real Prefect components started here: `prefect server start` (SQLite in a
temporary PREFECT_HOME and, where PostgreSQL is installed, PostgreSQL) and a `prefect worker start`
process on a process work pool, running deployments against an emulator over HTTP.

One stack per database for the module, both started at once (a server, its own emulator with a key of its
own, a worker whose environment holds that key: the only way the key reaches the runs). `imagebatch
deploy` runs in this process under `temporary_settings` pointing at the stack's server; the server is
read over its REST API. The session's Prefect test harness (tests/flows/conftest.py) is not used here:
nothing in this module talks to Prefect except through the servers it starts, and the harness would
add its start-up to this module's run on its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from helpers.emulator import run_emulator_settings
from helpers.prefect_server import (
    PrefectServer,
    kill_machine,
    postgres_database_url,
    running_prefect_server,
    running_worker,
    start_worker,
    stop_process_group,
    submitted_by,
)
from helpers.runs import catalog

from imagebatch.cli.main import main
from imagebatch.gateway.emulator import EmulatorServer
from imagebatch.run.preflight import NO_SERVICE

pytestmark = pytest.mark.slow  # its own Prefect servers and workers

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "manifests" / "examples" / "catalog.csv"
CATALOG_REQUESTS = 6  # one image per row
POOL = "imagebatch-test-pool"  # has a worker
YAML_POOL = "imagebatch"  # prefect.yaml's (no worker here)
IDLE_POOL = "imagebatch-idle-pool"  # has none: scheduled runs of its deployments stay scheduled
FLOW = "generate_from_manifest"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
PG_DATABASE = f"imagebatch_test_deploy_{os.getpid()}"  # one per test run: helpers run at once
BACKENDS = ("sqlite", "postgres")
# What Prefect 3.8.8's scheduler logs on SQLAlchemy 2.1 (pinned below 2.1 in pyproject.toml for it).
SCHEDULER_BROKEN = "Can't evaluate bulk DML statement"


@pytest.fixture(scope="module", autouse=True)
def prefect_harness() -> None:
    """Overrides tests/flows/conftest.py's session harness for this module: no temporary server needed."""


@dataclass
class Stack:
    """A real Prefect server, an emulator with its own key, and one process worker on `POOL` holding it."""

    backend: str
    server: PrefectServer
    emulator: EmulatorServer
    worker_log: Path
    database_url: str | None

    @property
    def api(self) -> str:
        return self.server.api_url

    def get(self, path: str) -> Any:
        return self._call("GET", path)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._call("POST", path, body or {})

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One REST call, retried like Prefect's own client retries it: a 502/503 (SQLite busy under the
        workers' writes), and, for a GET (a read, safe to repeat), a read timeout. Prefect 3.8.8's server on
        SQLite can stall every request for 60 s when two workers poll one pool: its writes wait on the
        database lock until SQLite's 60 s busy timeout (seen in the sharded test; Prefect issue #23051).
        The runs ride that out, since Prefect's client retries too, and so must the test's reads."""
        deadline = time.monotonic() + 150
        while True:
            try:
                response = httpx.request(method, f"{self.api}{path}", json=body, timeout=60)
            except (httpx.ReadTimeout, httpx.PoolTimeout):
                if method != "GET" or time.monotonic() > deadline:
                    raise
                continue
            if response.status_code not in (502, 503) or time.monotonic() > deadline:
                response.raise_for_status()
                return response.json()
            time.sleep(0.2)

    def deployment(self, name: str) -> dict[str, Any]:
        return dict(self.get(f"/deployments/name/{FLOW}/{name}"))

    def deploy(self, arguments: str) -> int:
        """`imagebatch deploy ARGUMENTS` (shell-quoted) in this process, against this stack's server."""
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.api}):
            return main(["deploy", *shlex.split(arguments)])

    def run(self, deployment_id: str) -> str:
        return str(self.post(f"/deployments/{deployment_id}/create_flow_run")["id"])

    def wait(self, flow_run_id: str, timeout: float = 150) -> dict[str, Any]:
        """Poll the flow run until it is in a final state (bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.get(f"/flow_runs/{flow_run_id}")
            if run["state_type"] in TERMINAL:
                return dict(run)
            if time.monotonic() > deadline:
                worker = self.worker_log.read_text(errors="replace")[-3000:]
                pytest.fail(f"flow run {flow_run_id} still {run['state_name']} after {timeout} s:\n{worker}")
            time.sleep(0.25)


@contextmanager
def running_stack(backend: str, home: Path) -> Iterator[Stack | None]:
    """Yields None for PostgreSQL where it is not installed."""
    database_url = postgres_database_url(PG_DATABASE) if backend == "postgres" else None
    if backend == "postgres" and database_url is None:
        yield None
        return
    key = f"sk-deploy-test-{secrets.token_hex(12)}"
    settings = run_emulator_settings(key)
    with (
        EmulatorServer(settings) as emulator,
        running_prefect_server(home / "server", database_url, stop_grace=3) as server,
    ):
        for pool in (POOL, IDLE_POOL, YAML_POOL):
            _create_process_pool(server.api_url, pool)
        worker_env = {"IMAGEBATCH_API_KEY": key, "PREFECT_HOME": str(home / "worker")}
        worker_log = home / "worker.log"
        with running_worker(server.api_url, POOL, worker_env, worker_log, stop_grace=3):
            yield Stack(backend, server, emulator, worker_log, database_url)


def _create_process_pool(api_url: str, name: str) -> None:
    """A pool with Prefect's process job template, before anything deploys to it."""
    from prefect.workers.process import ProcessWorker

    body = {
        "name": name,
        "type": "process",
        "base_job_template": ProcessWorker.get_default_base_job_template(),
    }
    httpx.post(f"{api_url}/work_pools/", json=body, timeout=10).raise_for_status()


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Stack | None]]:
    """Both stacks, started at once (each takes 15-25 s, mostly the server's start and migrations)."""
    # The folders are made here, not in the threads: two first calls of `mktemp` at once race in pytest's
    # making of its base folder (with `--basetemp`, one removes what the other just made).
    homes = {backend: tmp_path_factory.mktemp(f"prefect-{backend}") for backend in BACKENDS}
    with ExitStack() as cleanup:

        def enter(backend: str) -> tuple[AbstractContextManager[Stack | None], Stack | None]:
            manager = running_stack(backend, homes[backend])
            return manager, manager.__enter__()

        with ThreadPoolExecutor(len(BACKENDS)) as pool:
            futures = {backend: pool.submit(enter, backend) for backend in BACKENDS}
        started: dict[str, Stack | None] = {}
        errors = []
        for backend, future in futures.items():
            try:
                manager, started[backend] = future.result()
                cleanup.push(manager.__exit__)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        yield started


@pytest.fixture(params=BACKENDS)
def stack(request: pytest.FixtureRequest, stacks: dict[str, Stack | None]) -> Stack:
    found = stacks[request.param]
    if found is None:
        pytest.skip(
            "PostgreSQL is not installed here (no pg_lsclusters/pg_ctlcluster): tested on SQLite only"
        )
    return found


@dataclass
class WorkerRuns:
    out: Path
    runs: list[dict[str, Any]]  # two runs of one deployment, started together
    ledger: list[dict[str, Any]]


@pytest.fixture(scope="module")
def worker_runs(
    stacks: dict[str, Stack | None], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, WorkerRuns]:
    """On each stack: deploy the catalog to the worker's pool against the stack's emulator, start two runs
    of it at once, wait for both to end."""
    started: dict[str, tuple[Stack, Path, list[str]]] = {}
    for backend, stack in stacks.items():
        if stack is None:
            continue
        out = tmp_path_factory.mktemp(f"worker-out-{backend}")
        code = stack.deploy(
            f"{CATALOG} --out {out} --name on-pool --work-pool {POOL} --base-url {stack.emulator.url} "
            "--cron '0 2 * * *'"
        )
        assert code == 0
        deployment_id = stack.deployment("on-pool")["id"]
        started[backend] = (stack, out, [stack.run(deployment_id), stack.run(deployment_id)])
    return {
        backend: WorkerRuns(out, [stack.wait(run) for run in runs], stack.emulator.ledger())
        for backend, (stack, out, runs) in started.items()
    }


def test_deploy_with_a_cron_schedule_is_on_the_server(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    out = tmp_path / "cron"
    code = stack.deploy(
        f"manifests/examples/catalog.csv --out {out} --name cron --cron '0 2 * * *' --timezone Europe/Paris "
        f"--work-pool {IDLE_POOL} --concurrency 8 --base-url embedded"
    )
    assert code == 0, capsys.readouterr().err
    assert "deployed generate_from_manifest/cron" in capsys.readouterr().out

    deployment = stack.deployment("cron")
    [schedule] = deployment["schedules"]
    assert schedule["schedule"]["cron"] == "0 2 * * *"
    assert schedule["schedule"]["timezone"] == "Europe/Paris"
    assert schedule["active"] is True
    assert deployment["paused"] is False
    assert deployment["entrypoint"] == "imagebatch.flows.batch.generate_from_manifest"
    assert deployment["work_pool_name"] == IDLE_POOL
    parameters = deployment["parameters"]
    assert parameters["manifest"] == str(CATALOG)  # made absolute
    assert parameters["out"] == str(out.resolve())
    assert parameters["concurrency"] == 8
    assert parameters["api_key_secret_block"] is None
    assert parameters["global_limit"] is None
    assert not any("key" in name for name in parameters if name != "api_key_secret_block")
    assert stack.emulator.api_key not in str(deployment)
    assert deployment["global_concurrency_limit"]["limit"] == 1
    assert deployment["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"

    # Deploying again updates it: the new schedule replaces the old, and no schedule removes it.
    assert (
        stack.deploy(
            f"{CATALOG} --out {out} --name cron --work-pool {IDLE_POOL} --interval 3600 --base-url embedded"
        )
        == 0
    )
    [schedule] = stack.deployment("cron")["schedules"]
    assert schedule["schedule"]["interval"] == 3600
    assert stack.deploy(f"{CATALOG} --out {out} --name cron --work-pool {IDLE_POOL} --base-url embedded") == 0
    assert stack.deployment("cron")["schedules"] == []


def test_the_servers_scheduler_creates_the_runs_of_the_schedule(stack: Stack, tmp_path: Path) -> None:
    code = stack.deploy(
        f"{CATALOG} --out {tmp_path / 'out'} --name scheduled --cron '0 2 * * *' --timezone Europe/Paris "
        f"--work-pool {IDLE_POOL} --base-url embedded"
    )
    assert code == 0
    deployment_id = stack.deployment("scheduled")["id"]
    query = {"deployments": {"id": {"any_": [deployment_id]}}}
    # The scheduler looks at recently changed deployments every 5 s; a loaded machine runs it late.
    deadline = time.monotonic() + 120
    while not (runs := stack.post("/flow_runs/filter", query)):
        assert SCHEDULER_BROKEN not in stack.server.log(), "the server's scheduler failed"
        assert time.monotonic() < deadline, "no scheduled run after 120 s"
        time.sleep(0.25)
    assert {run["state_name"] for run in runs} == {"Scheduled"}
    paris = ZoneInfo("Europe/Paris")
    starts = [datetime.fromisoformat(run["expected_start_time"]).astimezone(paris) for run in runs]
    assert {(start.hour, start.minute) for start in starts} == {(2, 0)}


def test_deploy_refuses_what_run_refuses_before_deploying(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("IMAGEBATCH_BASE_URL", raising=False)
    out = f"{tmp_path / 'out'} --base-url embedded"  # an address: each case below fails for its own reason
    bad = tmp_path / "bad.csv"
    bad.write_text("id,prompt,image_size\nx,a cat,1k\n")
    assert stack.deploy(f"{CATALOG} --out {tmp_path / 'out'} --name bad --work-pool {POOL}") == 2
    assert capsys.readouterr().err.strip() == f"imagebatch deploy: {NO_SERVICE}"  # no address: one line
    assert stack.deploy(f"{bad} --out {out} --name bad --work-pool {POOL}") == 2
    assert "did you mean" in capsys.readouterr().err
    assert stack.deploy(f"{CATALOG} --out {out} --name bad --base-url http://u:Hunter2@127.0.0.1:9") == 2
    assert "must not hold a user name or password" in (err := capsys.readouterr().err)
    assert "Hunter2" not in err
    assert stack.deploy(f"{CATALOG} --out {out} --name bad --cron 'every night' --work-pool {POOL}") == 2
    assert "--cron 'every night' is not a cron expression" in capsys.readouterr().err
    assert stack.deploy(f"{CATALOG} --out {out} --name bad --work-pool no-such-pool") == 2
    assert "prefect work-pool create no-such-pool --type process" in capsys.readouterr().err
    assert stack.deploy(f"{CATALOG} --out {out} --name bad") == 2
    assert "imagebatch serve" in capsys.readouterr().err
    assert stack.deploy(f"{CATALOG} --out {out} --name bad --work-pool {POOL} --global-limit no-such") == 2
    assert "imagebatch limits --name no-such" in capsys.readouterr().err
    with pytest.raises(httpx.HTTPStatusError):
        stack.deployment("bad")


def test_a_worker_runs_the_deployment_and_writes_the_images(
    stack: Stack, worker_runs: dict[str, WorkerRuns]
) -> None:
    done = worker_runs[stack.backend]
    [completed] = [run for run in done.runs if run["state_type"] == "COMPLETED"]
    images = [p for p in (done.out / "images").rglob("*") if p.suffix in (".png", ".jpg")]
    assert len(images) >= CATALOG_REQUESTS
    assert (done.out / "results.csv").read_text().count(",succeeded,") == CATALOG_REQUESTS
    assert len(done.ledger) == CATALOG_REQUESTS
    assert completed["parameters"]["out"] == str(done.out)


def test_two_overlapping_runs_do_not_both_send(stack: Stack, worker_runs: dict[str, WorkerRuns]) -> None:
    done = worker_runs[stack.backend]
    assert sorted(run["state_type"] for run in done.runs) == ["CANCELLED", "COMPLETED"]
    [cancelled] = [run for run in done.runs if run["state_type"] == "CANCELLED"]
    assert cancelled["state"]["message"] == "Deployment concurrency limit reached."
    keys = [entry["idempotency_key"] for entry in done.ledger]
    assert len(keys) == CATALOG_REQUESTS
    assert len(set(keys)) == len(keys)


def test_the_key_is_nowhere_in_the_prefect_database(stack: Stack, worker_runs: dict[str, WorkerRuns]) -> None:
    assert any(run["state_type"] == "COMPLETED" for run in worker_runs[stack.backend].runs)
    key = stack.emulator.api_key.encode()
    if stack.database_url is None:
        files = sorted((stack.server.home).glob("*.db*"))  # the database and its write-ahead log
        assert files, f"no SQLite database in {stack.server.home}"
        dump = b"".join(path.read_bytes() for path in files)
    else:
        dump = subprocess.run(
            ["su", "postgres", "-c", f"pg_dump --data-only {PG_DATABASE}"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    assert b"generate_from_manifest" in dump and b"on-pool" in dump  # it does hold the runs' records
    assert key not in dump
    assert key not in stack.server.log_path.read_bytes()


def test_deploy_refuses_without_a_prefect_server(tmp_path: Path) -> None:
    """No PREFECT_API_URL (and a profile-less PREFECT_HOME): exit 2, one line saying how to start one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "home")
    out = str(tmp_path / "out")
    cmd = [
        sys.executable,
        "-m",
        "imagebatch.cli.main",
        "deploy",
        str(CATALOG),
        "--out",
        out,
        "--base-url",
        "embedded",
        "--name",
        "nightly",
        "--cron",
        "0 2 * * *",
        "--work-pool",
        POOL,
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "PREFECT_API_URL is not set" in lines[0]
    assert "`prefect server start`" in lines[0]
    assert "export PREFECT_API_URL=http://127.0.0.1:4200/api" in lines[0]
    assert done.stdout == ""


def _prefect_deploy(stack: Stack, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`prefect deploy --name nightly-yaml` with the repository's prefect.yaml, against `stack`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "IMAGEBATCH_"))}
    clean |= {"PREFECT_API_URL": stack.api, "PREFECT_HOME": str(home), "PWD": str(REPO), **env}
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--name", "nightly-yaml"]
    return subprocess.run(cmd, cwd=REPO, env=clean, capture_output=True, text=True, timeout=180, check=False)


def test_prefect_yaml_refuses_without_an_address_and_makes_what_imagebatch_deploy_makes(
    stacks: dict[str, Stack | None], tmp_path: Path
) -> None:
    """Issue 20, item 6 (SQLite stack only): without IMAGEBATCH_BASE_URL, prefect.yaml's build step
    (`imagebatch deploy --check`) refuses and nothing is deployed; with it, the deployment is the one
    `imagebatch deploy` makes for the same inputs, under its own name (never replacing `nightly`)."""
    stack = stacks["sqlite"]
    assert stack is not None
    refused = _prefect_deploy(stack, tmp_path / "home")
    assert refused.returncode != 0
    assert NO_SERVICE in refused.stdout + refused.stderr
    with pytest.raises(httpx.HTTPStatusError):
        stack.deployment("nightly-yaml")

    done = _prefect_deploy(stack, tmp_path / "home", IMAGEBATCH_BASE_URL="embedded")
    assert done.returncode == 0, done.stdout + done.stderr
    yaml = stack.deployment("nightly-yaml")
    code = stack.deploy(
        f"{CATALOG} --out {REPO / 'out' / 'nightly'} --name nightly --work-pool {YAML_POOL} --concurrency 4 "
        "--cron '0 2 * * *' --base-url embedded"
    )
    assert code == 0
    command = stack.deployment("nightly")
    assert yaml["entrypoint"] == command["entrypoint"] == "imagebatch.flows.batch.generate_from_manifest"
    assert yaml["pull_steps"] == [] and command["pull_steps"] in ([], None)
    for field in ("work_pool_name", "tags", "job_variables", "concurrency_options"):
        assert yaml[field] == command[field], field
    assert yaml["job_variables"] == {"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}
    assert yaml["global_concurrency_limit"]["limit"] == command["global_concurrency_limit"]["limit"] == 1
    given = {k: v for k, v in command["parameters"].items() if v is not None}
    assert yaml["parameters"] == {k: v for k, v in given.items() if k in yaml["parameters"]}
    assert yaml["parameters"]["base_url"] == "embedded"
    assert {k for k in given if k not in yaml["parameters"]} <= {"adaptive", "report", "edit"}  # defaults
    [schedule] = yaml["schedules"]
    assert schedule["schedule"]["cron"] == command["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    assert len(stack.post("/automations/filter")) >= 1


def test_a_sharded_run_on_two_workers_keeps_the_global_limit_and_sends_each_key_once(
    stack: Stack, tmp_path: Path
) -> None:
    """Issue 11, item 4: the parent plans, two shard runs share the work on the pool's two workers, all
    under one global limit of 4, every key sent once; the parent merges and writes the records; a rerun
    sends nothing."""
    from collections import Counter

    from helpers.runs import peak_in_flight, read_results
    from prefect.settings import PREFECT_API_URL, temporary_settings

    key = stack.emulator.api_key
    manifest = tmp_path / "big.csv"
    catalog(manifest, 40, "s")
    out = tmp_path / "out"
    settings = run_emulator_settings(key, latency=0.2)
    second = {"IMAGEBATCH_API_KEY": key, "PREFECT_HOME": str(tmp_path / "worker-2")}
    with (
        EmulatorServer(settings) as emulator,
        running_worker(stack.api, POOL, second, tmp_path / "worker-2.log", stop_grace=3),
    ):
        with temporary_settings({PREFECT_API_URL: stack.api}):
            assert main(["limits", "--name", "t-shards", "--concurrency", "4"]) == 0
        code = stack.deploy(
            f"{manifest} --out {out} --name sharded --work-pool {POOL} --shards 2 --concurrency 16 "
            f"--global-limit t-shards --base-url {emulator.url}"
        )
        assert code == 0
        assert stack.deployment("sharded-shards")["global_concurrency_limit"] is None
        parent = stack.wait(stack.run(stack.deployment("sharded")["id"]), timeout=240)
        assert parent["state_type"] == "COMPLETED", parent["state"]

        run = json.loads((out / "run.json").read_text())
        assert [s["state"] for s in run["shard_runs"]] == ["COMPLETED", "COMPLETED"]
        assert {r["status"] for r in read_results(out)} == {"succeeded"} and len(read_results(out)) == 40
        sent = Counter(r["idempotency_key"] for r in emulator.requests())
        assert len(sent) == 40 and set(sent.values()) == {1}  # each key once, over both machines
        assert peak_in_flight(emulator.requests()) <= 4  # the global limit held across both shards
        assert not list(out.glob("journal.shard-*")) and not list(out.glob("usage.shard-*"))  # merged
        started = [e for e in map(json.loads, (out / "journal.jsonl").read_text().splitlines())
                   if e["event"] == "attempt_started"]  # fmt: skip
        assert len(started) == 40

        rerun = stack.wait(stack.run(stack.deployment("sharded")["id"]), timeout=240)
        assert rerun["state_type"] == "COMPLETED"
        assert len(emulator.requests()) == 40  # nothing sent again
        assert {r["status"] for r in read_results(out)} == {"skipped"}


def test_a_shard_whose_machine_dies_leaves_unknown_and_unsent_and_a_rerun_finishes_with_no_duplicate(
    stacks: dict[str, Stack | None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collections import Counter

    from helpers.runs import read_results, run_flow
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from imagebatch.run.final_state import ran_to_end
    from imagebatch.run.hooks import RunHooks, run_hooks

    stack = stacks["sqlite"]
    assert stack is not None
    pool = "imagebatch-kill-pool"
    _create_process_pool(stack.api, pool)
    key = stack.emulator.api_key
    monkeypatch.setenv("IMAGEBATCH_API_KEY", key)  # the parent runs here, in this process
    manifest = tmp_path / "m.csv"
    catalog(manifest, 40, "k")
    out = tmp_path / "out"
    env = {"IMAGEBATCH_API_KEY": key, "PREFECT_HOME": str(tmp_path / "w")}

    def parent() -> dict[str, Any]:
        hooks = RunHooks(shard_grace=8.0)
        with temporary_settings({PREFECT_API_URL: stack.api}), run_hooks(hooks):
            return run_flow(
                manifest=str(manifest), out=str(out), concurrency=4, base_url=emulator.url, adaptive=False,
                shards=2, shard_deployment=f"{FLOW}/killable-shards",
            )  # fmt: skip

    with EmulatorServer(run_emulator_settings(key, latency=1.0)) as emulator:
        worker = start_worker(stack.api, pool, env, tmp_path / "w1.log")
        try:
            assert (
                stack.deploy(
                    f"{manifest} --out {out} --name killable --work-pool {pool} --shards 2 "
                    f"--base-url {emulator.url}"
                )
                == 0
            )
            with ThreadPoolExecutor(1) as pool_thread:
                first = pool_thread.submit(parent)
                deadline = time.monotonic() + 120
                query = {"deployments": {"name": {"any_": ["killable-shards"]}}}
                while True:  # real processes: wait (bounded) until the worker's shard is sending
                    running = {
                        r["id"]
                        for r in stack.post("/flow_runs/filter", query)
                        if r["state_type"] == "RUNNING"
                    }
                    on_worker = running & submitted_by(tmp_path / "w1.log")
                    if on_worker and len(emulator.requests()) >= 6:
                        break
                    assert time.monotonic() < deadline, "the worker's shard did not start sending in 120 s"
                    time.sleep(0.05)
                assert kill_machine(worker, on_worker) >= 1  # the worker's machine, not the parent's
                info = first.result(timeout=240)
        finally:
            stop_process_group(worker, grace=1)
        by_run = {s["flow_run_id"]: (s["state"], s["here"]) for s in info["shard_runs"]}
        [lost] = on_worker
        assert by_run.pop(lost) == ("CRASHED", False)
        assert list(by_run.values()) == [("COMPLETED", True)]  # shard 0, in the parent's process
        statuses = Counter(r["status"] for r in read_results(out))
        assert statuses["unknown"] >= 1 and statuses["not_attempted"] >= 1  # in flight, and never sent
        assert "succeeded" not in statuses or statuses["succeeded"] < 40

        with running_worker(stack.api, pool, env, tmp_path / "w2.log", stop_grace=3):
            again = parent()
        # Both shards ran to their end; one left with an `unknown` request ends Failed (issue 20: its
        # requests are not all done), which the parent reads as run through, not as a broken shard.
        assert all(ran_to_end(s["state"], s["message"]) for s in again["shard_runs"]), again["shard_runs"]
        sent = Counter(r["idempotency_key"] for r in emulator.requests())
        assert set(sent.values()) == {1}  # no request sent twice, over both runs
        assert len(sent) == 40  # every request sent once: the unknown ones only before the rerun
        final = Counter(r["status"] for r in read_results(out))
        assert (
            final["not_attempted"] == 0 and final["unknown"] == statuses["unknown"]
        )  # left for the user to settle, never resent
        assert final["unknown"] + final["succeeded"] + final["skipped"] == 40


def test_a_deployment_run_without_an_address_fails_with_one_line(stack: Stack, tmp_path: Path) -> None:
    """Issue 20, item 6: a deployment made without `imagebatch deploy`'s check (here by Prefect's own API,
    as an old one would be) and a worker without IMAGEBATCH_BASE_URL: the run fails, saying so, and the
    embedded emulator is never started."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from imagebatch.platform.deploy import build_deployment

    parameters = {"manifest": str(CATALOG), "out": str(tmp_path / "out")}
    with temporary_settings({PREFECT_API_URL: stack.api}):
        deployment_id = build_deployment("no-address", parameters, None, POOL).apply(work_pool_name=POOL)
    run = stack.wait(stack.run(str(deployment_id)))
    assert run["state_type"] == "FAILED"
    assert NO_SERVICE in run["state"]["message"]
    assert not (tmp_path / "out" / "images").exists()


def _automations(stack: Stack) -> list[dict[str, Any]]:
    from imagebatch.platform.deploy import AUTOMATION_NAME

    return [a for a in stack.post("/automations/filter") if a["name"] == AUTOMATION_NAME]


def test_deploy_sets_up_the_heartbeat_automation_once(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20, item 4: `imagebatch deploy` creates Prefect's zombie-run automation for the runs tagged
    imagebatch and updates it on each deploy (one of it, its window from IMAGEBATCH_HEARTBEAT_WINDOW);
    the deployment's runs get a heartbeat every 30 s through the job variables."""
    args = f"{CATALOG} --out {tmp_path / 'out'} --name beats --work-pool {IDLE_POOL} --base-url embedded"
    monkeypatch.setenv("IMAGEBATCH_HEARTBEAT_WINDOW", "120")
    assert stack.deploy(args) == 0
    monkeypatch.delenv("IMAGEBATCH_HEARTBEAT_WINDOW")
    assert stack.deploy(args) == 0
    [automation] = _automations(stack)
    trigger = automation["trigger"]
    assert trigger["posture"] == "Proactive" and trigger["within"] == 90.0
    assert trigger["after"] == ["prefect.flow-run.heartbeat"]
    assert (
        "prefect.flow-run.heartbeat" in trigger["expect"]
        and "prefect.flow-run.Completed" in trigger["expect"]
    )
    assert trigger["match_related"] == {
        "prefect.resource.role": "tag",
        "prefect.resource.id": "prefect.tag.imagebatch",
    }
    [action] = automation["actions"]
    assert action["type"] == "change-flow-run-state" and action["state"] == "CRASHED"
    deployment = stack.deployment("beats")
    assert deployment["job_variables"] == {"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}
    assert deployment["tags"] == ["imagebatch"]


def test_a_killed_run_is_marked_crashed_and_the_next_run_sends_only_the_rest(
    stacks: dict[str, Stack | None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20, item 4: `kill -9` of a worker and its flow run's process mid-run. The run's heartbeats
    stop, the automation marks it Crashed within the window (45 s here: the heartbeat is 30 s at least),
    which frees the deployment's slot of one: the next run starts (not Cancelled) and sends only what
    the killed one had not sent (counted in the emulator's request log)."""
    from collections import Counter

    from helpers.runs import read_results

    stack = stacks["sqlite"]
    assert stack is not None
    pool, window = "imagebatch-zombie-pool", 45.0
    _create_process_pool(stack.api, pool)
    key = stack.emulator.api_key
    manifest = tmp_path / "m.csv"
    catalog(manifest, 20, "z")
    out = tmp_path / "out"
    env = {"IMAGEBATCH_API_KEY": key, "PREFECT_HOME": str(tmp_path / "w")}
    monkeypatch.setenv("IMAGEBATCH_HEARTBEAT_WINDOW", f"{window:g}")
    with EmulatorServer(run_emulator_settings(key, latency=1.0)) as emulator:
        args = f"{manifest} --out {out} --name zombie --work-pool {pool} --base-url {emulator.url}"
        assert stack.deploy(f"{args} --concurrency 2 --no-adaptive") == 0
        deployment_id = stack.deployment("zombie")["id"]
        worker = start_worker(stack.api, pool, env, tmp_path / "w1.log")
        try:
            first = stack.run(deployment_id)
            deadline = time.monotonic() + 120
            while len(emulator.requests()) < 4:
                assert time.monotonic() < deadline, "the first run sent nothing in 120 s"
                time.sleep(0.05)
            assert kill_machine(worker, {first}) == 1
            killed_at = time.monotonic()
        finally:
            stop_process_group(worker, grace=1)
        sent_before = Counter(r["idempotency_key"] for r in emulator.requests())
        crashed = stack.wait(first, timeout=window + 90)
        assert crashed["state_type"] == "CRASHED", crashed["state"]
        assert "no heartbeat" in crashed["state"]["message"]
        print(f"marked Crashed {time.monotonic() - killed_at:.1f} s after the kill")
        assert time.monotonic() - killed_at < window + 30  # within the window (and the server's 5 s loop)

        with running_worker(stack.api, pool, env, tmp_path / "w2.log", stop_grace=3):
            second = stack.wait(stack.run(deployment_id), timeout=180)
        # Not cancelled by a zombie's slot: the run ran to its own verdict (run.final_state), which is Failed
        # only for the requests the killed run left `unknown` (sent, never answered; not resent).
        assert second["state_type"] in ("COMPLETED", "FAILED"), second["state"]
        assert second["state"]["message"].startswith("imagebatch: "), second["state"]
        sent = Counter(r["idempotency_key"] for r in emulator.requests())
        assert set(sent.values()) == {1}  # nothing sent twice
        assert len(sent) == 20 and len(sent) > len(sent_before)  # the rest, and only the rest
        statuses = Counter(r["status"] for r in read_results(out))
        assert statuses["unknown"] + statuses["succeeded"] + statuses["skipped"] == 20
        assert (second["state_type"] == "COMPLETED") == (statuses["unknown"] == 0)


def _sharded_deploy(stack: Stack, tmp_path: Path, pool: str, emulator: EmulatorServer, timeout: float) -> str:
    manifest = tmp_path / "m.csv"
    catalog(manifest, 16, "p")
    code = stack.deploy(
        f"{manifest} --out {tmp_path / 'out'} --name {pool} --work-pool {pool} --shards 2 --concurrency 4 "
        f"--base-url {emulator.url} --shard-start-timeout {timeout:g}"
    )
    assert code == 0
    return str(stack.deployment(pool)["id"])


@contextlib.contextmanager
def _shard_children() -> Iterator[dict[int, bytes]]:
    """The environment (`/proc/PID/environ`) of every `imagebatch.run.shard_child` process seen while
    the block runs (polled; a shard child lives for seconds)."""
    seen: dict[int, bytes] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit() or int(proc.name) in seen:
                    continue
                with contextlib.suppress(OSError):
                    if b"imagebatch.run.shard_child" in (proc / "cmdline").read_bytes():
                        seen[int(proc.name)] = (proc / "environ").read_bytes()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(timeout=30)


def test_shards_on_one_worker_with_limit_1_do_not_deadlock(
    stacks: dict[str, Stack | None], tmp_path: Path
) -> None:
    """Issue 20, item 5: one worker started with `--limit 1`: the parent holds its only slot, so it runs
    shard 0 itself at once and shard 1 once no worker has started it within the start timeout."""
    from collections import Counter

    stack = stacks["sqlite"]
    assert stack is not None
    pool = "imagebatch-one-slot"
    _create_process_pool(stack.api, pool)
    key = stack.emulator.api_key
    env = {"IMAGEBATCH_API_KEY": key, "PREFECT_HOME": str(tmp_path / "w")}
    with (
        EmulatorServer(run_emulator_settings(key, latency=0.2)) as emulator,
        running_worker(stack.api, pool, env, tmp_path / "w.log", extra_args=("--limit", "1"), stop_grace=3),
        _shard_children() as children,
    ):
        parent = stack.wait(stack.run(_sharded_deploy(stack, tmp_path, pool, emulator, 3)), timeout=240)
    assert parent["state_type"] == "COMPLETED", parent["state"]
    # The shards the parent ran got the key on stdin (they sent with it), never in their environment.
    assert children and not [pid for pid, environ in children.items() if key.encode() in environ]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert [(s["state"], s["here"]) for s in run["shard_runs"]] == [("COMPLETED", True), ("COMPLETED", True)]
    assert submitted_by(tmp_path / "w.log") == {parent["id"]}
    sent = Counter(r["idempotency_key"] for r in emulator.requests())
    assert len(sent) == 16 and set(sent.values()) == {1}


def test_two_shards_on_two_workers_with_limit_1_run_one_per_worker(
    stacks: dict[str, Stack | None], tmp_path: Path
) -> None:
    """Issue 20, item 5: two workers, each `--limit 1`, two shards: the parent (on one worker) runs one
    shard, the other worker takes the other; no deadlock, one shard per machine."""
    from collections import Counter

    stack = stacks["sqlite"]
    assert stack is not None
    pool = "imagebatch-two-slots"
    _create_process_pool(stack.api, pool)
    key = stack.emulator.api_key
    logs = [tmp_path / "w1.log", tmp_path / "w2.log"]
    with ExitStack() as workers:
        emulator = workers.enter_context(EmulatorServer(run_emulator_settings(key, latency=0.2)))
        for i, log in enumerate(logs):
            env = {"IMAGEBATCH_API_KEY": key, "PREFECT_HOME": str(tmp_path / f"w{i}")}
            workers.enter_context(
                running_worker(stack.api, pool, env, log, extra_args=("--limit", "1"), stop_grace=3)
            )
        parent = stack.wait(stack.run(_sharded_deploy(stack, tmp_path, pool, emulator, 120)), timeout=240)
    assert parent["state_type"] == "COMPLETED", parent["state"]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    shard_runs = run["shard_runs"]
    assert {s["state"] for s in shard_runs} == {"COMPLETED"}
    # The parent claims the first shard no worker has (shard 0, or shard 1 when a worker was quicker).
    [in_parent] = [s["flow_run_id"] for s in shard_runs if s["here"]]
    [on_worker] = [s["flow_run_id"] for s in shard_runs if not s["here"]]
    by_worker = [submitted_by(log) for log in logs]
    parents_worker = next(i for i, ran in enumerate(by_worker) if parent["id"] in ran)
    assert by_worker[1 - parents_worker] == {on_worker}  # the other machine
    assert by_worker[parents_worker] == {parent["id"]}  # the other shard ran in the parent's slot
    assert in_parent not in by_worker[0] | by_worker[1]
    sent = Counter(r["idempotency_key"] for r in emulator.requests())
    assert len(sent) == 16 and set(sent.values()) == {1}


def test_deploy_into_a_bucket_refuses_a_missing_bucket_and_a_url_with_a_secret_before_deploying(
    stacks: dict[str, Stack | None], s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 19, item 1: the deployer's credentials reach the bucket before anything is deployed (exit 2,
    one line naming the bucket and the cause); a URL that holds a secret is refused without showing it."""
    stack = stacks["sqlite"]
    assert stack is not None
    common = f"--name to-bucket --work-pool {POOL} --base-url embedded"
    assert stack.deploy(f"{CATALOG} --out s3://no-such-bucket-ib/nightly {common}") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("imagebatch deploy: --out s3://no-such-bucket-ib/nightly: ")
    assert "the bucket 'no-such-bucket-ib' does not exist (NoSuchBucket" in lines[0]
    assert stack.deploy(f"{CATALOG} --out s3://AKIAEXAMPLE:Hunter2@{s3.bucket()}/n {common}") == 2
    err = capsys.readouterr().err
    assert "holds a user, password or query" in err and "Hunter2" not in err and "AKIAEXAMPLE" not in err
    with pytest.raises(httpx.HTTPStatusError):
        stack.deployment("to-bucket")


def test_a_sharded_deployment_into_a_bucket_on_two_machines_that_share_nothing_writes_everything_once(
    stacks: dict[str, Stack | None], s3: Any, tmp_path: Path
) -> None:
    """Issue 19, item 4: `deploy --shards 2 --out s3://...`, two real workers (`--limit 1`) whose working
    folder, HOME, PREFECT_HOME and TMPDIR are their own empty folders, each with the store's address and
    credentials in its environment: the parent runs one shard, the other machine the other; each request
    is sent once (the emulator's request log), results.csv is whole in the bucket, the journal is one
    compacted object, and neither the key nor the store's secret is in an object, the deployment, or a
    shard child's environment."""
    from collections import Counter

    from helpers.runs import read_results

    stack = stacks["sqlite"]
    assert stack is not None
    pool = "imagebatch-bucket"
    _create_process_pool(stack.api, pool)
    key = stack.emulator.api_key
    bucket = s3.bucket()
    url = f"s3://{bucket}/nightly"
    manifest = tmp_path / "deployer" / "m.csv"
    manifest.parent.mkdir()
    catalog(manifest, 16, "b")
    machines = [tmp_path / f"machine-{i}" for i in range(2)]
    with ExitStack() as workers:
        emulator = workers.enter_context(EmulatorServer(run_emulator_settings(key, latency=0.2)))
        for i, home in enumerate(machines):
            (home / "tmp").mkdir(parents=True)
            env = {
                "IMAGEBATCH_API_KEY": key,
                "HOME": str(home),
                "PREFECT_HOME": str(home / ".prefect"),
                "TMPDIR": str(home / "tmp"),
                **s3.env(),
            }
            log = tmp_path / f"w{i}.log"
            workers.enter_context(
                running_worker(stack.api, pool, env, log, extra_args=("--limit", "1"), stop_grace=3, cwd=home)
            )
        code = stack.deploy(
            f"{manifest} --out {url} --name {pool} --work-pool {pool} --shards 2 --concurrency 4 "
            f"--base-url {emulator.url} --shard-start-timeout 120"
        )
        assert code == 0
        deployment = stack.deployment(pool)
        with _shard_children() as children:
            parent = stack.wait(stack.run(str(deployment["id"])), timeout=240)
    assert parent["state_type"] == "COMPLETED", parent["state"]
    assert deployment["parameters"]["out"] == url

    objects = s3.objects(bucket, "nightly")
    run = json.loads(objects["run.json"])
    assert [s["state"] for s in run["shard_runs"]] == ["COMPLETED", "COMPLETED"]
    assert sorted(s["here"] for s in run["shard_runs"]) == [False, True]  # one shard on each machine
    (tmp_path / "results.csv").write_bytes(objects["results.csv"])
    rows = read_results(tmp_path)
    assert len(rows) == 16 and {r["status"] for r in rows} == {"succeeded"}
    assert all(objects[p].startswith(b"\x89PNG") for r in rows for p in r["paths"].split(";"))
    assert "report.html" in objects and len([n for n in objects if n.startswith("thumbs/")]) == 16
    sent = Counter(r["idempotency_key"] for r in emulator.requests())
    assert len(sent) == 16 and set(sent.values()) == {1}  # each key sent exactly once, over both machines
    [journal] = [n for n in objects if n.startswith("journal/")]  # the shards' segments, compacted
    assert journal.endswith("-compact.jsonl")
    assert {".imagebatch.lease", ".imagebatch.shard-0-of-2.lease", ".imagebatch.shard-1-of-2.lease"} <= set(
        objects
    )
    assert not [p for home in machines for p in home.rglob("*") if p.suffix in (".png", ".csv", ".jsonl")]
    secrets_ = (key.encode(), s3.secret_key.encode())
    assert not [name for name, data in objects.items() if any(s in data for s in secrets_)]
    assert s3.secret_key not in json.dumps(deployment) and key not in json.dumps(deployment)
    assert children and not [pid for pid, env in children.items() if any(s in env for s in secrets_)]


def test_the_emulator_is_used_in_a_deployment_only_when_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20, item 6: outside a deployment no address means the emulator (the quick start); in one,
    only `embedded` (option or IMAGEBATCH_BASE_URL) does, and no address is refused with one line."""
    from imagebatch.run.preflight import UsageError, resolve_base_url

    monkeypatch.delenv("IMAGEBATCH_BASE_URL", raising=False)
    assert resolve_base_url(None) is None
    with pytest.raises(UsageError) as refused:
        resolve_base_url(None, deployed=True)
    assert str(refused.value) == NO_SERVICE and "\n" not in NO_SERVICE
    assert resolve_base_url("embedded", deployed=True) is None
    monkeypatch.setenv("IMAGEBATCH_BASE_URL", "embedded")
    assert resolve_base_url(None, deployed=True) is None
    monkeypatch.setenv("IMAGEBATCH_BASE_URL", "https://gateway.example")
    assert resolve_base_url(None, deployed=True) == "https://gateway.example"
