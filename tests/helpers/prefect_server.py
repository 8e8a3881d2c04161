"""Real Prefect components for tests and benchmarks: a `prefect server start` process (SQLite, or PostgreSQL
with a database from `helpers.postgres`), and `prefect worker start` processes.

    with running_prefect_server(tmp / "prefect") as server:          # SQLite in tmp/prefect
        env = {"IMAGEBATCH_API_KEY": key}                              # the worker's env reaches its runs
        with running_worker(server.api_url, "pool", env, tmp / "worker.log") as worker:
            ...

    with postgres_database("imagebatch_test") as url:                  # helpers.postgres; None when absent
        with running_prefect_server(tmp / "pg", database_url=url) as server: ...  # dropped after

Every process is started in its own session (so a Ctrl-C of the test run does not reach it first) and is
stopped as a whole process group (SIGTERM, then SIGKILL) in a `finally`, and, whatever is left, when the
test process ends (`stop_started`: at pytest's session finish and at exit; tests/conftest.py makes a
SIGTERM of the test run an interrupt, so those run then too). Only a `kill -9` of the test process
leaves one: `ps -eo pid,args | grep -E 'prefect (server|worker)'` finds it. No child is given
`IMAGEBATCH_API_KEY` unless the caller passes it (to a worker, on purpose); no child inherits our
`PREFECT_*` settings (the test harness's temporary server, profiles): each gets exactly the Prefect
settings it needs. Everything binds 127.0.0.1 only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from imagebatch.platform.prefect_template import seed_database

__all__ = [
    "PrefectServer",
    "api_call",
    "base_environment",
    "free_port",
    "kill_machine",
    "prefect_api",
    "running_prefect_server",
    "running_worker",
    "start_worker",
    "stop_process_group",
    "stop_started",
    "submitted_by",
]

# Never passed on to a child unless the caller adds it explicitly.
_WITHHELD = ("IMAGEBATCH_API_KEY",)
# Quiet and offline: these machines cannot reach Prefect's telemetry host.
_QUIET = {"DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


@dataclass(frozen=True)
class PrefectServer:
    """A running `prefect server start`: its API (`http://127.0.0.1:PORT/api`), pid, PREFECT_HOME, log."""

    api_url: str
    pid: int
    home: Path
    log_path: Path

    @property
    def ui_url(self) -> str:
        return self.api_url.removesuffix("/api")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def base_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment without the API key and without any `PREFECT_*` setting, plus telemetry off and
    `extra` (which may name the key on purpose)."""
    env = {k: v for k, v in os.environ.items() if k not in _WITHHELD and not k.startswith("PREFECT_")}
    env.update(_QUIET)
    env.update(extra or {})
    return env


def _prefect_command(*args: str) -> list[str]:
    """`prefect ARGS` through this interpreter's installation (the venv's), whatever PATH says."""
    return [sys.executable, "-m", "prefect", *args]


_STARTED: dict[int, subprocess.Popen[bytes]] = {}
"""The process groups started here and not stopped yet, by pid."""


def _started(process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    _STARTED[process.pid] = process
    return process


def stop_started(grace: float = 3.0) -> None:
    """Stop every process group started here that is still running (a test stopped by `-x`, Ctrl-C or a
    SIGTERM between a start and its `finally`, a thread's start whose stop was never reached)."""
    for process in list(_STARTED.values()):
        stop_process_group(process, grace)


atexit.register(stop_started)


def stop_process_group(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM the process's whole group (it leads its own session), SIGKILL it after `grace` s, reap."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:  # the group is gone already
            break
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; its children (uvicorn, flow runs) may not be: finish them off.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        break
    if process.poll() is None:
        process.wait(timeout=10)
    _STARTED.pop(process.pid, None)


def _wait_healthy(api_url: str, process: subprocess.Popen[bytes], home: Path, timeout: float) -> bool:
    """Wait until the server answers; True if it is ours (its PREFECT_HOME is `home`), False if another
    test process's server holds the port (tests run on two xdist workers) and ours could not bind it."""
    log_path = home / "server.log"
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while True:
            if process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
                if "address already in use" in tail.lower():
                    return False
                raise RuntimeError(f"prefect server exited with {process.returncode}:\n{tail}")
            try:
                if client.get(f"{api_url}/health").status_code == 200:
                    settings = client.get(f"{api_url}/admin/settings", timeout=10.0).json()
                    return bool(Path(settings["home"]).resolve() == home)
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
                raise TimeoutError(f"prefect server not healthy at {api_url} after {timeout} s:\n{tail}")
            time.sleep(0.2)


@contextmanager
def running_prefect_server(
    home: Path,
    database_url: str | None = None,
    timeout: float = 300,
    *,
    extra_env: Mapping[str, str] | None = None,
    stop_grace: float = 5.0,
) -> Iterator[PrefectServer]:
    """Start `prefect server start` on a free loopback port with PREFECT_HOME=`home` (SQLite in `home`
    unless `database_url` names another database), wait for `/health`, yield it, stop its process group.

    `timeout` bounds the wait for `/health`, not a guess at the start's length: a start takes 6-8 s on an
    idle 2-core machine and took over 120 s at load 25 (a test failed so), hence 300 by default.
    The UI is off (faster to start; the API is all a test needs). `extra_env` adds Prefect settings, e.g.
    `{"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5"}`. Its stdout and stderr go to
    `home/server.log`.

    A SQLite server in an empty home starts on the database imagebatch ships for its temporary server
    (`platform.prefect_template.seed_database`: what a first start builds, without 6 of its 12 CPU s).
    """
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # a port another test process took between `free_port` and the bind: again
        process, api_url = _start_server(home, database_url, extra_env)
        try:
            ours = _wait_healthy(api_url, process, home, timeout)
        except BaseException:
            stop_process_group(process, stop_grace)
            raise
        if ours:
            break
        stop_process_group(process, stop_grace)
    else:
        raise RuntimeError(
            f"prefect server: another process took its port three times (see {home}/server.log)"
        )
    try:
        yield PrefectServer(api_url=api_url, pid=process.pid, home=home, log_path=home / "server.log")
    finally:
        stop_process_group(process, stop_grace)


def _start_server(
    home: Path, database_url: str | None, extra_env: Mapping[str, str] | None
) -> tuple[subprocess.Popen[bytes], str]:
    """`prefect server start` on a port free a moment ago, its output appended to `home/server.log`."""
    log_path = home / "server.log"
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = base_environment(
        {
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_UI_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "PREFECT_SERVER_API_HOST": "127.0.0.1",
            "PREFECT_SERVER_API_PORT": str(port),
            **({"PREFECT_SERVER_DATABASE_CONNECTION_URL": database_url} if database_url else {}),
            **(extra_env or {}),
        }
    )
    seed_database(env)
    cmd = _prefect_command("server", "start", "--host", "127.0.0.1", "--port", str(port), "--analytics-off")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return _started(process), api_url


def start_worker(
    api_url: str,
    pool: str,
    env: Mapping[str, str],
    log_path: Path,
    *,
    query_seconds: float = 1.0,
    extra_args: tuple[str, ...] = (),
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start `prefect worker start --pool POOL --type process` against `api_url`, in its own session.

    `env` is added to the worker's environment (our environment without the key and without `PREFECT_*`);
    the flow runs it starts inherit it, so `{"IMAGEBATCH_API_KEY": key}` is how a key reaches them without
    being a parameter. The worker polls every `query_seconds` (Prefect's default is 10 s) and creates the
    pool if it does not exist. `cwd`: its working folder (default: ours), for a machine that shares no disk.
    Stop it with `stop_process_group` (or use `running_worker`).
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    worker_env = base_environment(
        {
            "PREFECT_API_URL": api_url,
            "PREFECT_WORKER_QUERY_SECONDS": str(query_seconds),
            "PREFECT_WORKER_PREFETCH_SECONDS": "5",
            **env,
        }
    )
    cmd = _prefect_command("worker", "start", "--pool", pool, "--type", "process", *extra_args)
    with open(log_path, "ab") as log:
        return _started(
            subprocess.Popen(
                cmd,
                env=worker_env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )


@contextmanager
def running_worker(
    api_url: str,
    pool: str,
    env: Mapping[str, str],
    log_path: Path,
    *,
    query_seconds: float = 1.0,
    extra_args: tuple[str, ...] = (),
    stop_grace: float = 5.0,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`start_worker`, stopped (its whole process group, flow runs included) on exit: SIGTERM (which a
    worker turns into its graceful SIGINT: no new runs, those running go on), SIGKILL after `stop_grace`."""
    process = start_worker(
        api_url, pool, env, log_path, query_seconds=query_seconds, extra_args=extra_args, cwd=cwd
    )
    try:
        yield process
    finally:
        stop_process_group(process, stop_grace)


# --- Machines that die, and which worker ran what -----------------------------------------------------


def kill_machine(worker: subprocess.Popen[bytes], flow_run_ids: set[str]) -> int:
    """What a machine's death does: its worker and the flow runs it started die at once (SIGKILL), with
    no chance to report. A flow run's process is found by its `PREFECT__FLOW_RUN_ID`. Returns how many
    flow-run processes were killed."""
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
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
    worker.wait(timeout=30)
    _STARTED.pop(worker.pid, None)
    return killed


def submitted_by(worker_log: Path) -> set[str]:
    """The flow runs a worker started, from its log: "submitting flow run 'ID'", unless followed by
    "Aborted submission of flow run 'ID'" (another worker claimed it first: the server accepts one)."""
    text = worker_log.read_text(errors="replace") if worker_log.exists() else ""
    tried = set(re.findall(r"submitting flow run '([0-9a-f-]{36})'", text))
    return tried - set(re.findall(r"Aborted submission of flow run '([0-9a-f-]{36})'", text))


def api_call(api_url: str, method: str, path: str, body: Any = None, *, repeatable: bool = False) -> Any:
    """One REST call, asked again as Prefect's own client asks again: on a 502/503 (SQLite busy under the
    workers' writes) and, for a read (a GET, a POST to a `/filter`) or a `repeatable` call (one whose
    second try cannot do anything twice, such as making a work pool by name), on a read timeout. Prefect
    3.8.8's server on SQLite can stall every request for up to 60 s while two workers poll (its writes wait
    on the database lock until SQLite's 60 s busy timeout; Prefect issue #23051; a 10 s bound failed a CI
    run), so each try waits 90 s, all of them 240 s. A 409 after a timed-out try of a repeatable call is
    that try's success: it is returned as None, as is an answer with no body (a 204 to a DELETE)."""
    repeatable = repeatable or method == "GET" or path.endswith("/filter")  # a filter is a read
    deadline = time.monotonic() + 240
    timed_out = False
    while True:
        try:
            response = _client().request(method, f"{api_url}{path}", json=body)
        except (httpx.ReadTimeout, httpx.PoolTimeout):
            if not repeatable or time.monotonic() > deadline:
                raise
            timed_out = True
            continue
        if response.status_code == 409 and timed_out:
            return None
        if response.status_code not in (502, 503) or time.monotonic() > deadline:
            response.raise_for_status()
            return response.json() if response.content else None
        time.sleep(0.2)


def _client() -> httpx.Client:
    """This thread's client for `api_call` (a client made per call, `httpx.request`, built a TLS context
    each time: ~50 ms of CPU a call, most of a `wait_for` loop's). No connection is kept: the servers here
    come and go, and a port can be a new server's."""
    client: httpx.Client | None = getattr(_CLIENTS, "client", None)
    if client is None:
        limits = httpx.Limits(max_keepalive_connections=0)
        client = _CLIENTS.client = httpx.Client(timeout=90, limits=limits)
    return client


_CLIENTS = threading.local()


def call(server: PrefectServer, method: str, path: str, body: Any = None) -> Any:
    """`api_call` on this server."""
    return api_call(server.api_url, method, path, body)


@contextmanager
def prefect_api(api_url: str, **settings: Any) -> Iterator[None]:
    """This process's Prefect client talks to the server at `api_url` for the block (with more Prefect
    settings by name, e.g. `PREFECT_CLIENT_MAX_RETRIES=0`), and sends its events there.

    Prefect keeps one events worker per process whatever the API it was made for (its key is the events
    client's type, not the URL): made inside such a block, it would send every later event of this test
    process (the task-run states of the session harness's flow runs) to this server, stopped by then, and
    each later run would wait its 30 s (`run.artifacts.settle_prefect_records`) for states the harness
    never gets. So the events workers are drained on the way in and out: each block's events go to its
    own server, and the next user makes a new worker for its own."""
    import prefect.settings
    from prefect.events.worker import EventsWorker

    values = {prefect.settings.PREFECT_API_URL: api_url}
    values |= {getattr(prefect.settings, name): value for name, value in settings.items()}
    EventsWorker.drain_all(timeout=30, at_exit=False)
    try:
        with prefect.settings.temporary_settings(values):
            yield
    finally:
        EventsWorker.drain_all(timeout=30, at_exit=False)


def create_process_pool(api_url: str, name: str) -> None:
    """A work pool with Prefect's process job template, before anything deploys to it."""
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    body = {"name": name, "type": "process", "base_job_template": template}
    api_call(api_url, "POST", "/work_pools/", body, repeatable=True)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 180, log: Path | None = None) -> Any:
    """Poll `check` until it returns something truthy (bounded; the machine is shared and slow), 0.1 s
    apart at first, then up to 0.5 s: a check is often a call to a server, whose CPU the suite shares."""
    deadline = time.monotonic() + timeout
    pause = 0.1
    while not (value := check()):
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            pytest.fail(f"{what}: not after {timeout} s\n{tail}")
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)
    return value
