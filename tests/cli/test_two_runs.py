"""Two `imagebatch run` processes into one folder, the second past its own check of the folder before the
first took it: the second's flow refuses to start (exit 2, nothing sent) in one line, with neither
Prefect's traceback of the refusal nor a failed log shipment after it, and the first goes on.

The second waits between its check and its flow on a Prefect server frozen with SIGSTOP; the first holds
the folder while the emulator holds its requests (a gate in its latency sleep). Every wait is for an
event, bounded."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.prefect_server import PrefectServer, base_environment, running_prefect_server, wait_for
from helpers.runs import write_jsonl

pytestmark = pytest.mark.slow  # a Prefect server of its own, and a run on its temporary one

ROWS = 3
EMULATOR_NOTICE = "No service address configured"


class Hold:
    """The emulator's latency sleep: holds every generation until `release`; `holding` once one waits."""

    def __init__(self) -> None:
        self.holding, self.release = threading.Event(), threading.Event()

    async def __call__(self, _seconds: float) -> None:
        self.holding.set()
        await asyncio.to_thread(self.release.wait)


@pytest.fixture(scope="module")
def frozen_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """A Prefect server of the module's, frozen (its process group stopped) until a test continues it."""
    with running_prefect_server(tmp_path_factory.mktemp("two-runs"), stop_grace=3) as server:
        os.killpg(server.pid, signal.SIGSTOP)
        try:
            yield server
        finally:
            os.killpg(server.pid, signal.SIGCONT)


def run_command(manifest: Path, out: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """`imagebatch run MANIFEST --out OUT` in a session of its own, with the service and Prefect settings
    of `env` only."""
    environ = {k: v for k, v in base_environment().items() if not k.startswith("IMAGEBATCH_")} | env
    cmd = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--out", str(out)]
    return subprocess.Popen(
        [*cmd, "--no-report"], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def test_a_run_refused_by_its_flow_says_so_in_one_line(
    service_env: Any, frozen_server: PrefectServer, tmp_path: Path
) -> None:
    manifest = write_jsonl(tmp_path / "m.jsonl", [{"id": f"r{i}", "prompt": f"p {i}"} for i in range(ROWS)])
    out = tmp_path / "out"
    second = run_command(
        manifest,
        out,
        {"PREFECT_HOME": str(tmp_path / "home-2"), "PREFECT_API_URL": frozen_server.api_url,
         "PREFECT_API_REQUEST_TIMEOUT": "600"},
    )  # fmt: skip
    gate = Hold()
    service_env.configure(latency=0.001, sleep=gate)
    first = None
    try:
        assert second.stderr is not None
        while EMULATOR_NOTICE not in (line := second.stderr.readline()):  # its checks passed
            assert line, f"the second run ended before its flow: {second.communicate()[1]}"
        first = run_command(
            manifest,
            out,
            {"PREFECT_HOME": str(tmp_path / "home-1"), "IMAGEBATCH_BASE_URL": service_env.url,
             "IMAGEBATCH_API_KEY": service_env.api_key},
        )  # fmt: skip
        wait_for("the first run sending", gate.holding.is_set, timeout=300)
        os.killpg(frozen_server.pid, signal.SIGCONT)
        stdout, err = second.communicate(timeout=300)
        gate.release.set()
        first_out, first_err = first.communicate(timeout=300)
    finally:
        os.killpg(frozen_server.pid, signal.SIGSTOP)
        gate.release.set()
        service_env.configure(sleep=asyncio.sleep, latency=0.0)
        for child in (first, second):
            if child is not None and child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
    refusal = (
        f"another imagebatch run is using {out}: wait for it to finish (two runs into one folder would "
        "send twice); nothing was sent."
    )
    assert second.returncode == 2 and stdout == "", err
    assert err.strip().splitlines() == [refusal]
    assert first.returncode == 0, first_err
    assert f"{ROWS} requests" in first_out
    assert len(service_env.requests()) == ROWS  # the first run's, each once
