"""`imagebatch worker` with no flow run stops at its SIGTERM, every time, with its `prefect worker` child:
on a real `prefect server start` (SQLite) and a process pool, also while that server stalls (frozen with
SIGSTOP, as a SQLite server under several workers stalls for up to a minute), when Prefect's worker,
stopped, waits at exit for the server without bound. Every wait is for an event, bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers.prefect_server import (
    PrefectServer,
    base_environment,
    stop_process_group,
    wait_for,
)
from helpers.shared_servers import PrefectServers

from imagebatch.platform.worker import STOP_BOUND

pytestmark = pytest.mark.slow  # a Prefect server (helpers.shared_servers) and workers

POOL = "stop-pool"
GONE_WITHIN = STOP_BOUND + 30  # generous: the machine is shared


@pytest.fixture(scope="module", autouse=True)
def prefect_harness() -> None:
    """Overrides the session harness: everything here talks to the server below."""


@pytest.fixture(scope="module")
def server(prefect_servers: PrefectServers) -> PrefectServer:
    return prefect_servers.sqlite(POOL)


def start_imagebatch_worker(server: PrefectServer, home: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {"PREFECT_HOME": str(home), "PREFECT_API_URL": server.api_url, "PREFECT_WORKER_QUERY_SECONDS": "1"}
    command = [sys.executable, "-m", "imagebatch.cli.main", "worker", "--pool", POOL]
    with open(log, "ab") as out:
        return subprocess.Popen(
            command, env=base_environment(env), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def running(pid: int) -> bool:
    """Neither gone nor a zombie (an orphan's zombie waits for a reaper that a container may lack)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@contextmanager
def stalled(server: PrefectServer, stall: bool) -> Iterator[None]:
    """The server frozen (its whole process group) while inside, when `stall`."""
    if stall:
        os.killpg(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if stall:
            os.killpg(server.pid, signal.SIGCONT)


def test_sigterm_stops_an_idle_worker_and_its_prefect_worker_every_time(
    server: PrefectServer, tmp_path: Path
) -> None:
    for attempt, stall in enumerate((True, False, True)):
        log = tmp_path / f"worker-{attempt}.log"
        code = sigterm_once(server, tmp_path / "home", log, stall)
        assert code in (0, 128 + signal.SIGTERM), log.read_text()
        if stall:
            assert f"the worker had not exited {STOP_BOUND:g} s after its stop" in log.read_text()


def sigterm_once(server: PrefectServer, home: Path, log: Path, stall: bool) -> int:
    """Start `imagebatch worker`, wait until it polls, SIGTERM it (the server frozen when `stall`), and
    fail unless it and its `prefect worker` are gone within `GONE_WITHIN` s; its exit code."""
    worker = start_imagebatch_worker(server, home, log)
    prefect_worker = 0
    try:
        wait_for("the worker polling", lambda: "started!" in log.read_text(errors="replace"), log=log)
        (prefect_worker,) = children(worker.pid)
        with stalled(server, stall):
            worker.send_signal(signal.SIGTERM)
            try:
                code = worker.wait(timeout=GONE_WITHIN)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {GONE_WITHIN} s after SIGTERM\n{log.read_text()}")
            wait_for("the prefect worker gone", lambda: not running(prefect_worker), timeout=10, log=log)
        return code
    finally:  # what a failed try leaves, killed (the prefect worker leads a session of its own)
        if worker.poll() is None:
            stop_process_group(worker, 1)
        if prefect_worker and running(prefect_worker):
            os.killpg(prefect_worker, signal.SIGKILL)
