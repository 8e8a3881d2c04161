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

import json
import os
import secrets
import shlex
import subprocess
import sys
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
from helpers.prefect_server import (
    PrefectServer,
    postgres_database_url,
    running_prefect_server,
    running_worker,
    start_worker,
    stop_process_group,
)

from imagebatch.flows.cli import main
from imagebatch.gateway.emulator import EmulatorServer, EmulatorSettings

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "manifests" / "examples" / "catalog.csv"
CATALOG_REQUESTS = 6  # one image per row
POOL = "imagebatch-test-pool"  # has a worker
YAML_POOL = "imagebatch"  # prefect.yaml's (no worker here)
IDLE_POOL = "imagebatch-idle-pool"  # has none: scheduled runs of its deployments stay scheduled
FLOW = "generate_from_manifest"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
PG_DATABASE = "imagebatch_test_deploy"
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
    settings = EmulatorSettings(api_key=key, seed=0, jpeg_rate=0.0)
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
        f"--work-pool {IDLE_POOL} --concurrency 8"
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
    assert stack.deploy(f"{CATALOG} --out {out} --name cron --work-pool {IDLE_POOL} --interval 3600") == 0
    [schedule] = stack.deployment("cron")["schedules"]
    assert schedule["schedule"]["interval"] == 3600
    assert stack.deploy(f"{CATALOG} --out {out} --name cron --work-pool {IDLE_POOL}") == 0
    assert stack.deployment("cron")["schedules"] == []


def test_the_servers_scheduler_creates_the_runs_of_the_schedule(stack: Stack, tmp_path: Path) -> None:
    code = stack.deploy(
        f"{CATALOG} --out {tmp_path / 'out'} --name scheduled --cron '0 2 * * *' --timezone Europe/Paris "
        f"--work-pool {IDLE_POOL}"
    )
    assert code == 0
    deployment_id = stack.deployment("scheduled")["id"]
    query = {"deployments": {"id": {"any_": [deployment_id]}}}
    deadline = time.monotonic() + 30  # the scheduler looks at recently changed deployments every 5 s
    while not (runs := stack.post("/flow_runs/filter", query)):
        assert SCHEDULER_BROKEN not in stack.server.log(), "the server's scheduler failed"
        assert time.monotonic() < deadline, "no scheduled run after 30 s"
        time.sleep(0.25)
    assert {run["state_name"] for run in runs} == {"Scheduled"}
    paris = ZoneInfo("Europe/Paris")
    starts = [datetime.fromisoformat(run["expected_start_time"]).astimezone(paris) for run in runs]
    assert {(start.hour, start.minute) for start in starts} == {(2, 0)}


def test_deploy_refuses_what_run_refuses_before_deploying(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out")
    bad = tmp_path / "bad.csv"
    bad.write_text("id,prompt,image_size\nx,a cat,1k\n")
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
        "imagebatch.flows.cli",
        "deploy",
        str(CATALOG),
        "--out",
        out,
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


def test_prefect_yaml_makes_the_same_deployment(stacks: dict[str, Stack | None], tmp_path: Path) -> None:
    """`prefect deploy --name nightly` with the repository's prefect.yaml (SQLite stack only)."""
    stack = stacks["sqlite"]
    assert stack is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "IMAGEBATCH_API_KEY"}
    env |= {"PREFECT_API_URL": stack.api, "PREFECT_HOME": str(tmp_path / "home"), "PWD": str(REPO)}
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--name", "nightly"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)

    deployment = stack.deployment("nightly")
    assert deployment["entrypoint"] == "imagebatch.flows.batch.generate_from_manifest"
    assert deployment["pull_steps"] == []
    assert deployment["work_pool_name"] == YAML_POOL
    assert deployment["parameters"] == {
        "manifest": str(CATALOG),
        "out": str(REPO / "out" / "nightly"),
        "concurrency": 4,
    }
    [schedule] = deployment["schedules"]
    assert schedule["schedule"]["cron"] == "0 2 * * *"
    assert deployment["global_concurrency_limit"]["limit"] == 1
    assert deployment["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"
    assert done.returncode == 0, done.stdout + done.stderr


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
    manifest.write_text("id,prompt\n" + "".join(f"s{i:03d},product {i}\n" for i in range(40)))
    out = tmp_path / "out"
    settings = EmulatorSettings(api_key=key, seed=0, jpeg_rate=0.0, latency=0.2)
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


def _kill_machine(worker: subprocess.Popen[bytes], flow_run_ids: set[str]) -> int:
    """What a machine's death does: its worker and the flow runs it started die at once (SIGKILL), with
    no chance to report. Returns how many flow-run processes were killed."""
    import signal

    os.killpg(worker.pid, signal.SIGKILL)
    killed = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"PREFECT__FLOW_RUN_ID=") and e.split(b"=", 1)[1].decode() in flow_run_ids
               for e in environ):  # fmt: skip
            os.kill(int(proc.name), signal.SIGKILL)
            killed += 1
    worker.wait(timeout=30)
    return killed


def test_a_shard_whose_machine_dies_leaves_unknown_and_unsent_and_a_rerun_finishes_with_no_duplicate(
    stacks: dict[str, Stack | None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collections import Counter

    from helpers.runs import read_results
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from imagebatch.flows.batch import RunHooks, generate_from_manifest, run_hooks

    stack = stacks["sqlite"]
    assert stack is not None
    pool = "imagebatch-kill-pool"
    _create_process_pool(stack.api, pool)
    key = stack.emulator.api_key
    monkeypatch.setenv("IMAGEBATCH_API_KEY", key)  # the parent runs here, in this process
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,prompt\n" + "".join(f"k{i:03d},item {i}\n" for i in range(40)))
    out = tmp_path / "out"
    env = {"IMAGEBATCH_API_KEY": key, "PREFECT_HOME": str(tmp_path / "w")}

    def parent() -> dict[str, Any]:
        hooks = RunHooks(shard_grace=8.0)
        with temporary_settings({PREFECT_API_URL: stack.api}), run_hooks(hooks):
            return generate_from_manifest(
                manifest=str(manifest), out=str(out), concurrency=4, base_url=emulator.url, adaptive=False,
                shards=2, shard_deployment=f"{FLOW}/killable-shards",
            )  # fmt: skip

    with EmulatorServer(EmulatorSettings(api_key=key, seed=0, jpeg_rate=0.0, latency=1.0)) as emulator:
        worker = start_worker(stack.api, pool, env, tmp_path / "w1.log")
        try:
            assert stack.deploy(f"{manifest} --out {out} --name killable --work-pool {pool} --shards 2") == 0
            with ThreadPoolExecutor(1) as pool_thread:
                first = pool_thread.submit(parent)
                deadline = time.monotonic() + 120
                while len(emulator.requests()) < 6 and time.monotonic() < deadline:
                    time.sleep(0.05)  # real processes: wait (bounded) until both shards are sending
                query = {"deployments": {"name": {"any_": ["killable-shards"]}}}
                running = {
                    r["id"] for r in stack.post("/flow_runs/filter", query) if r["state_type"] == "RUNNING"
                }
                assert _kill_machine(worker, running) >= 1
                info = first.result(timeout=240)
        finally:
            stop_process_group(worker, grace=1)
        assert {s["state"] for s in info["shard_runs"]} == {"CRASHED"}
        statuses = Counter(r["status"] for r in read_results(out))
        assert statuses["unknown"] >= 1 and statuses["not_attempted"] >= 1  # in flight, and never sent
        assert "succeeded" not in statuses or statuses["succeeded"] < 40

        with running_worker(stack.api, pool, env, tmp_path / "w2.log", stop_grace=3):
            again = parent()
        assert [s["state"] for s in again["shard_runs"]] == ["COMPLETED", "COMPLETED"]
        sent = Counter(r["idempotency_key"] for r in emulator.requests())
        assert set(sent.values()) == {1}  # no request sent twice, over both runs
        assert len(sent) == 40  # every request sent once: the unknown ones only before the rerun
        final = Counter(r["status"] for r in read_results(out))
        assert (
            final["not_attempted"] == 0 and final["unknown"] == statuses["unknown"]
        )  # left for the user to settle, never resent
        assert final["unknown"] + final["succeeded"] + final["skipped"] == 40
