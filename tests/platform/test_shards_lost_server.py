"""A sharded run whose Prefect server dies while its shards send (`run.shard_runs`): the parent stops asking
the server, knows each shard's end from what it sees itself (its own shard's process, the worker's shard's
lock), and writes the run's records all the same; nothing is sent twice. On a real `prefect server start`
of its own (killed here), a real worker, and the parent in this process."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.prefect_server import (
    create_process_pool,
    prefect_api,
    running_prefect_server,
    start_worker,
    stop_process_group,
    wait_for,
)
from helpers.runs import Gate, read_results, run_flow

from imagebatch.cli.main import main
from imagebatch.emulator import EmulatorServer, EmulatorSettings
from imagebatch.run.api_guard import NOTE
from imagebatch.run.constants import FLOW_NAME
from imagebatch.run.hooks import RunHooks, run_hooks
from imagebatch.run.shard_runs import UNKNOWN

pytestmark = pytest.mark.slow  # a Prefect server of its own, and a worker

KEY = "lost-server-key-123"
POOL = "imagebatch-lost-server"
ROWS = 40


def test_a_sharded_runs_parent_writes_the_records_when_prefect_dies_while_the_shards_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both shards hold four requests in flight (the emulator answers none until the server is killed
    and the parent has looked at its shards without it): one runs in the parent's child process, one on
    the worker. With Prefect's server gone, both go on
    (Prefect is their bookkeeping: `run.api_guard`) and send the rest; the parent reads its child's end
    from its exit and the worker's from its lock, free for the grace, and writes results.csv and run.json:
    every request succeeded, each key sent once, each shard's end `UNKNOWN` to Prefect, and the run's
    summary says Prefect's record is incomplete."""
    monkeypatch.setenv("IMAGEBATCH_API_KEY", KEY)  # the parent and its child run here
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,prompt\n" + "".join(f"l{i:03d},item {i}\n" for i in range(ROWS)))
    out = tmp_path / "out"
    gate = Gate(0)
    settings = EmulatorSettings(api_key=KEY, seed=0, jpeg_rate=0.0, latency=0.01, sleep=gate)
    with running_prefect_server(tmp_path / "server") as server, EmulatorServer(settings) as emulator:
        create_process_pool(server.api_url, POOL)
        args = f"{manifest} --out {out} --name lost --work-pool {POOL} --shards 2 --base-url {emulator.url}"
        with prefect_api(server.api_url):
            assert main(["deploy", *args.split()]) == 0

        def parent() -> dict[str, Any] | BaseException:
            with prefect_api(server.api_url), run_hooks(RunHooks(shard_grace=8.0)):
                try:
                    return run_flow(
                        manifest=str(manifest), out=str(out), concurrency=4, adaptive=False,
                        base_url=emulator.url, shards=2, shard_deployment=f"{FLOW_NAME}/lost-shards",
                    )  # fmt: skip
                except Exception as exc:  # checked below, once the server and the worker are stopped
                    return exc

        env = {"IMAGEBATCH_API_KEY": KEY, "PREFECT_HOME": str(tmp_path / "w")}
        worker = start_worker(server.api_url, POOL, env, tmp_path / "worker.log")
        try:
            with ThreadPoolExecutor(1) as thread, Said("Prefect's server is lost") as without_prefect:
                ended = thread.submit(parent)
                _wait_until_both_hold_requests(gate, ended, tmp_path / "worker.log")
                os.killpg(server.pid, signal.SIGKILL)  # the server's process group: the server dies at once
                # Answered once the parent has looked at the shards without the server (it says so after
                # its first look): both were holding their locks then, with requests in flight.
                assert without_prefect.wait(timeout=240), "the parent never lost the server"
                gate.release.set()
                outcome = ended.result(timeout=600)
        finally:
            gate.release.set()
            stop_process_group(worker, grace=3)

    # The flow returns its summary, or Prefect's engine fails to record the run's end on a server gone.
    assert isinstance(outcome, dict | httpx.TransportError), outcome
    sent = Counter(r["idempotency_key"] for r in emulator.requests())
    assert len(sent) == ROWS and set(sent.values()) == {1}  # every request, each once
    assert Counter(r["status"] for r in read_results(out)) == {"succeeded": ROWS}
    run = json.loads((out / "run.json").read_text())
    states = sorted((s["state"], s["here"]) for s in run["shard_runs"])
    assert states == [(UNKNOWN, False), (UNKNOWN, True)], run["shard_runs"]
    assert all("Prefect's server was lost" in s["message"] for s in run["shard_runs"])
    assert run["prefect"]["incomplete"].startswith(NOTE)


def _wait_until_both_hold_requests(gate: Gate, ended: Any, worker_log: Path) -> None:
    """Eight requests held (four a shard, at concurrency 4): both shards are mid-send. Bounded: real
    processes on a loaded machine start in tens of seconds."""

    def holding() -> bool:
        if ended.done():
            raise AssertionError(f"the parent ended first: {ended.result()!r}")
        return gate.calls >= 8

    wait_for("both shards holding four requests", holding, 240, log=worker_log)


class Said(logging.Handler):
    """Set once the flow run's logger says `text` while in its `with` (a record of this process: the
    parent runs here)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.event = text, threading.Event()

    def __enter__(self) -> Said:
        logging.getLogger("prefect.flow_runs").addHandler(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        logging.getLogger("prefect.flow_runs").removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()

    def wait(self, timeout: float) -> bool:
        return self.event.wait(timeout)
