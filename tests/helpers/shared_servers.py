"""One `prefect server start` per database in each test process, shared by the test modules that ask for
one (the `prefect_servers` fixture, tests/conftest.py), each module finding it emptied.

    server = prefect_servers.sqlite("a-pool")     # emptied, with a process work pool "a-pool"
    server = prefect_servers.fresh("postgres")    # None where PostgreSQL is absent

A server costs 7-8 CPU s to start even on the template database, most of it importing Prefect's server,
and twice that in wall time on a loaded machine; the platform modules each started their own (thirteen a
run). `fresh` starts one the first time a module asks and hands the same one to the next module, after
deleting everything a module makes through the API (`empty`: flow runs, deployments, work pools,
automations, blocks, concurrency limits, variables, artifacts): no module sees an earlier one's runs,
pools, automations or blocks, as on a new server. What stays is what tests read only by their own ids
(events and logs, by flow run) and the flows' names.

A server is stopped at the end of a test file that did not use it, or when the next file uses none
(`file_ended`, called from tests/conftest.py's `pytest_runtest_teardown`): a server nobody uses still costs
CPU (1.4 s a minute idle on SQLite; PostgreSQL's, kept through files that did not use it, cost 50 CPU s in
8 minutes). The test files go to the workers slowest first, the ones that use these servers
first among them, so a SQLite server seldom starts twice in a process.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack
from pathlib import Path

from helpers.postgres import postgres_database
from helpers.prefect_server import PrefectServer, api_call, create_process_pool, running_prefect_server

__all__ = ["MADE", "PrefectServers", "empty"]

MADE = (  # what a test can make: how to list it, the field that names one, how to delete one
    ("/flow_runs/filter", "id", "/flow_runs/{}"),
    ("/deployments/filter", "id", "/deployments/{}"),
    ("/work_pools/filter", "name", "/work_pools/{}"),
    ("/automations/filter", "id", "/automations/{}"),
    ("/block_documents/filter", "id", "/block_documents/{}"),
    ("/v2/concurrency_limits/filter", "id", "/v2/concurrency_limits/{}"),
    ("/concurrency_limits/filter", "tag", "/concurrency_limits/tag/{}"),
    ("/variables/filter", "name", "/variables/name/{}"),
    ("/artifacts/filter", "id", "/artifacts/{}"),
)
_PAGE = 200  # Prefect's largest page


def empty(api_url: str) -> None:
    """Delete every flow run, deployment, work pool, automation, block document, concurrency limit,
    variable and artifact the server at `api_url` lists."""
    for listing, field, path in MADE:
        deleted: set[str] = set()
        while found := [str(item[field]) for item in api_call(api_url, "POST", listing, {"limit": _PAGE})]:
            if deleted.issuperset(found):
                raise RuntimeError(f"{listing}: deleted, yet listed again: {found[:3]}")
            for name in found:
                api_call(api_url, "DELETE", path.format(name))
            deleted.update(found)


class PrefectServers:
    """The process's shared servers, by database ("sqlite", "postgres"), started when first asked for
    (two databases' at once from two threads)."""

    def __init__(self, base: Path) -> None:
        self._base = base
        self._running: dict[str, tuple[PrefectServer, str | None] | None] = {}
        self._stacks: dict[str, ExitStack] = {}
        self._asked: set[str] = set()
        self.starts = 0

    def fresh(self, backend: str, *pools: str) -> PrefectServer | None:
        """The running server of `backend` (started now if none runs), emptied, with a process work pool
        of each name in `pools`; None for PostgreSQL where it is not installed."""
        self._asked.add(backend)
        if backend not in self._running:
            self._running[backend] = self._start(backend)
        running = self._running[backend]
        if running is None:
            return None
        empty(running[0].api_url)
        for pool in pools:
            create_process_pool(running[0].api_url, pool)
        return running[0]

    def sqlite(self, *pools: str) -> PrefectServer:
        """`fresh("sqlite", *pools)`: SQLite is always there."""
        server = self.fresh("sqlite", *pools)
        assert server is not None
        return server

    def database_url(self, backend: str) -> str | None:
        """The database URL of `backend`'s running server (None for SQLite, in the server's home)."""
        running = self._running.get(backend)
        return running[1] if running else None

    def _start(self, backend: str) -> tuple[PrefectServer, str | None] | None:
        with ExitStack() as stack:  # closed if the start fails
            url = None
            if backend == "postgres":
                url = stack.enter_context(postgres_database(f"imagebatch_test_{os.getpid()}"))
            if backend == "postgres" and url is None:
                return None
            home = Path(tempfile.mkdtemp(prefix=f"{backend}-", dir=self._base))
            server = stack.enter_context(running_prefect_server(home, url, stop_grace=3))
            self._stacks[backend] = stack.pop_all()  # one thread a backend: no lock needed
        self.starts += 1
        return server, url

    def file_ended(self, next_file_uses_one: bool) -> None:
        """At the end of a test file (its fixtures torn down): the servers it did not ask for stopped, and
        all of them when the next file uses none."""
        for backend in list(self._running):
            if backend not in self._asked or not next_file_uses_one:
                self._stop(backend)
        self._asked.clear()

    def stop(self) -> None:
        """Stop every server started here (PostgreSQL's database dropped); the next `fresh` starts anew."""
        for backend in list(self._running):
            self._stop(backend)

    def _stop(self, backend: str) -> None:
        self._running.pop(backend, None)
        if stack := self._stacks.pop(backend, None):
            stack.close()
