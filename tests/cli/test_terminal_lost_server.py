"""Losing Prefect's server mid-run (issue 21 #2): `imagebatch run`'s temporary server killed with SIGKILL
while requests are in flight. Sending and stopping never wait for Prefect; the records on disk are
complete; the summary and run.json say that Prefect's record of the run is incomplete."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import read_results, write_jsonl

from imagebatch.run.api_guard import NOTE

JOBS = 40
HOLD_AFTER = 8  # generations let through before the gate holds the rest
BOUND = 90.0
"""Generous: the run ends in seconds once the gate opens; before the fix, each of the run's calls to the
dead server (progress, three artifacts, the wait for its records, the flow run's final state) retried for
about a minute (2 + 4 + 8 + 16 + 32 s), so the run's end alone took five minutes."""


class Gate:
    """The emulator's latency sleep: lets the first `open_for` generations through, holds the rest until
    `release` (requests are in flight while the server is killed)."""

    def __init__(self, open_for: int) -> None:
        self.open_for = open_for
        self.calls = 0
        self.holding = threading.Event()
        self.release = threading.Event()

    async def __call__(self, _seconds: float) -> None:
        self.calls += 1
        if self.calls > self.open_for and not self.release.is_set():
            self.holding.set()
            await asyncio.to_thread(self.release.wait)


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prefect-home")


def _server_of(pid: int) -> int:
    """The pid of the temporary server run `pid` started (`python -m
    imagebatch.platform.prefect_server PID`)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"imagebatch.platform.prefect_server" in args and str(pid).encode() in args[3].split(b":"):
                return int(proc.name)
    raise AssertionError(f"run {pid} has no temporary Prefect server")


def _start(service_env: Any, prefect_home: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    """`imagebatch run` as its own process on its own temporary Prefect server, against the session's
    emulator; once the gate holds requests, its server is killed (SIGKILL)."""
    manifest = write_jsonl(
        tmp_path / "m.jsonl", [{"id": f"j{i:02d}", "prompt": f"p {i}"} for i in range(JOBS)]
    )
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"PREFECT_HOME": str(prefect_home), "IMAGEBATCH_BASE_URL": service_env.url}
    env["IMAGEBATCH_API_KEY"] = service_env.api_key
    cmd = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--out", str(out)]
    cmd += ["--concurrency", "4", "--no-report"]
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return child, out


def _kill_server_when_holding(child: subprocess.Popen[str], gate: Gate) -> None:
    if not gate.holding.wait(timeout=300):
        child.kill()
        raise AssertionError(child.communicate()[1])
    server = _server_of(child.pid)
    os.kill(server, signal.SIGKILL)


def _finish(child: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return child.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        child.kill()
        _out, err = child.communicate()
        raise AssertionError(
            f"the run did not end within {BOUND:g} s of the gate opening:\n{err[-3000:]}"
        ) from None


def test_a_run_whose_prefect_server_dies_sends_everything_and_ends(
    service_env: Any, prefect_home: Path, tmp_path: Path
) -> None:
    gate = Gate(HOLD_AFTER)
    service_env.configure(latency=0.001, sleep=gate)
    child, out = _start(service_env, prefect_home, tmp_path)
    try:
        _kill_server_when_holding(child, gate)
        gate.release.set()
        _stdout, err = _finish(child)
    finally:
        gate.release.set()
        service_env.configure(sleep=asyncio.sleep, latency=0.0)
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    rows = read_results(out)
    assert Counter(r["status"] for r in rows) == {"succeeded": JOBS}
    assert Counter(e["idempotency_key"] for e in service_env.ledger()).most_common(1)[0][1] == 1
    run = json.loads((out / "run.json").read_text())
    note = run["prefect"]["incomplete"]
    assert run["state"] == "finished" and note.startswith(NOTE)
    assert f"{note}." in err and "Traceback" not in err, err


def test_sigterm_stops_a_run_whose_prefect_server_died(
    service_env: Any, prefect_home: Path, tmp_path: Path
) -> None:
    gate = Gate(HOLD_AFTER)
    service_env.configure(latency=0.001, sleep=gate)
    child, out = _start(service_env, prefect_home, tmp_path)
    try:
        _kill_server_when_holding(child, gate)
        child.send_signal(signal.SIGTERM)  # requests are held in flight: they finish, the rest are not sent
        assert child.stderr is not None
        while "Stopping (SIGTERM)" not in (line := child.stderr.readline()):
            assert line, "the run ended without acknowledging SIGTERM"
        gate.release.set()
        _stdout, err = _finish(child)
    finally:
        gate.release.set()
        service_env.configure(sleep=asyncio.sleep, latency=0.0)
        if child.poll() is None:
            child.kill()
    assert child.returncode == 128 + signal.SIGTERM, err
    rows = read_results(out)
    statuses = Counter(r["status"] for r in rows)
    assert len(rows) == JOBS and statuses["succeeded"] >= HOLD_AFTER and statuses["not_attempted"] > 0
    assert statuses["unknown"] == 0  # the requests in flight finished and were saved
    run = json.loads((out / "run.json").read_text())
    assert run["state"] == "stopped" and run["stopped"] == "interrupted (SIGTERM)"
    assert run["prefect"]["incomplete"].startswith(NOTE)
    assert "Traceback" not in err, err
