"""Real Prefect stacks for the deployment tests (tests/platform/test_deploy*.py): per database, a
`prefect server start` (SQLite and, where PostgreSQL is installed, PostgreSQL: the test process's shared
servers, `helpers.shared_servers`, emptied for the module), an emulator with a key of its own and a
`prefect worker start` process on a process work pool holding that key (the only way the key reaches the
runs). A module imports the fixtures `stacks` and `stack` (one stack per database for the module:
`started_stacks`, `each_stack`; the module's `STACK_BACKENDS` may name fewer databases than both) and
`prefect_harness` (`no_session_harness`), which replaces the session's Prefect test harness: nothing there
talks to Prefect except through the servers named here.
"""

from __future__ import annotations

import secrets
import shlex
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers.prefect_server import (
    PrefectServer,
    api_call,
    prefect_api,
    running_worker,
)
from helpers.shared_servers import PrefectServers
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
        with prefect_api(self.api):
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
def _stack_on(server: PrefectServer, home: Path, backend: str, database_url: str | None) -> Iterator[Stack]:
    """On `server`: an emulator with a key of its own, and a worker on `POOL` holding it."""
    key = f"sk-deploy-test-{secrets.token_hex(12)}"
    settings = EmulatorSettings(api_key=key, seed=0, jpeg_rate=0.0)
    with EmulatorServer(settings) as emulator:
        worker_env = {"IMAGEBATCH_API_KEY": key, "PREFECT_HOME": str(home / "worker")}
        worker_log = home / "worker.log"
        with running_worker(server.api_url, POOL, worker_env, worker_log, stop_grace=3):
            yield Stack(backend, server, emulator, worker_log, database_url)


@pytest.fixture(scope="module", name="stacks")
def started_stacks(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, prefect_servers: PrefectServers
) -> Iterator[dict[str, Stack | None]]:
    """The module's stacks, one per database in the module's `STACK_BACKENDS` (default: both), on the
    process's shared servers (`helpers.shared_servers`; None for PostgreSQL where it is not installed).
    A module whose tests all run on SQLite says `STACK_BACKENDS = ("sqlite",)`: a worker none of them
    use would poll for the whole module (on a 2-core machine its CPU is the other tests' time)."""
    backends = tuple(getattr(request.module, "STACK_BACKENDS", BACKENDS))
    # The folders are made here, not in the threads: two first calls of `mktemp` at once race in pytest's
    # making of its base folder (with `--basetemp`, one removes what the other just made).
    homes = {backend: tmp_path_factory.mktemp(f"stack-{backend}") for backend in backends}
    with ThreadPoolExecutor(len(backends)) as threads:  # the first module's servers start at once
        found = threads.map(
            lambda backend: prefect_servers.fresh(backend, POOL, IDLE_POOL, YAML_POOL), backends
        )
        servers = dict(zip(backends, found, strict=True))
    with ExitStack() as stacks:
        yield {
            backend: None if server is None else stacks.enter_context(
                _stack_on(server, homes[backend], backend, prefect_servers.database_url(backend))
            )
            for backend, server in servers.items()
        }  # fmt: skip


@pytest.fixture(params=BACKENDS, name="stack")
def each_stack(request: pytest.FixtureRequest, stacks: dict[str, Stack | None]) -> Stack:
    found = stacks[request.param]
    if found is None:
        pytest.skip(
            "PostgreSQL is not installed here (no pg_lsclusters/pg_ctlcluster): tested on SQLite only"
        )
    return found
