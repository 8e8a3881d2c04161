"""Real Prefect stacks for the deployment tests (tests/platform/test_deploy*.py): per database, a
`prefect server start` (SQLite in a temporary PREFECT_HOME and, where PostgreSQL is installed, PostgreSQL),
an emulator with a key of its own and a `prefect worker start` process on a process work pool holding that
key (the only way the key reaches the runs). A module imports the fixtures `stacks` and `stack` (one
stack per database for the module, started at once: `started_stacks`, `each_stack`; the module's
`STACK_BACKENDS` may name fewer databases than both) and `prefect_harness` (`no_session_harness`), which
replaces the session's Prefect test harness: nothing there talks to Prefect except through the servers
started here.
"""

from __future__ import annotations

import os
import secrets
import shlex
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers.postgres import postgres_database
from helpers.prefect_server import (
    PrefectServer,
    api_call,
    create_process_pool,
    running_prefect_server,
    running_worker,
)
from imagebatch.cli.main import main
from imagebatch.emulator import EmulatorServer, EmulatorSettings

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


@pytest.fixture(scope="module", autouse=True, name="prefect_harness")
def no_session_harness() -> None:
    """Overrides the session's Prefect test harness for the module that imports it: no temporary server
    needed."""


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
        return api_call(self.api, method, path, body)

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
    with postgres_database(PG_DATABASE) if backend == "postgres" else nullcontext() as database_url:
        if backend == "postgres" and database_url is None:
            yield None
        else:
            with _stack(backend, home, database_url) as stack:
                yield stack


@contextmanager
def _stack(backend: str, home: Path, database_url: str | None) -> Iterator[Stack]:
    key = f"sk-deploy-test-{secrets.token_hex(12)}"
    settings = EmulatorSettings(api_key=key, seed=0, jpeg_rate=0.0)
    with (
        EmulatorServer(settings) as emulator,
        running_prefect_server(home / "server", database_url, stop_grace=3) as server,
    ):
        for pool in (POOL, IDLE_POOL, YAML_POOL):
            create_process_pool(server.api_url, pool)
        worker_env = {"IMAGEBATCH_API_KEY": key, "PREFECT_HOME": str(home / "worker")}
        worker_log = home / "worker.log"
        with running_worker(server.api_url, POOL, worker_env, worker_log, stop_grace=3):
            yield Stack(backend, server, emulator, worker_log, database_url)


@pytest.fixture(scope="module", name="stacks")
def started_stacks(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Stack | None]]:
    """The module's stacks, started at once (each takes 15-25 s, mostly the server's start): one per
    database in the module's `STACK_BACKENDS` (default: both). A module whose tests all run on SQLite
    says `STACK_BACKENDS = ("sqlite",)`: a PostgreSQL server and its worker none of them use would start,
    poll and stop for the whole module (on a 2-core machine their CPU is the other tests' time)."""
    backends = tuple(getattr(request.module, "STACK_BACKENDS", BACKENDS))
    # The folders are made here, not in the threads: two first calls of `mktemp` at once race in pytest's
    # making of its base folder (with `--basetemp`, one removes what the other just made).
    homes = {backend: tmp_path_factory.mktemp(f"prefect-{backend}") for backend in backends}
    with ExitStack() as cleanup:

        def enter(backend: str) -> tuple[AbstractContextManager[Stack | None], Stack | None]:
            manager = running_stack(backend, homes[backend])
            return manager, manager.__enter__()

        with ThreadPoolExecutor(len(backends)) as pool:
            futures = {backend: pool.submit(enter, backend) for backend in backends}
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


@pytest.fixture(params=BACKENDS, name="stack")
def each_stack(request: pytest.FixtureRequest, stacks: dict[str, Stack | None]) -> Stack:
    found = stacks[request.param]
    if found is None:
        pytest.skip(
            "PostgreSQL is not installed here (no pg_lsclusters/pg_ctlcluster): tested on SQLite only"
        )
    return found
