"""The nightly walkthrough of docs/prefect/deployments.md ("A nightly run, step by step"), run as a reader
runs it from a clone: step 1's `prefect server start` (on a free loopback port rather than 4200, so that it
never meets another server of this machine), then every command of the block marked
`<!-- example: nightly -->`, each as its own process in the reader's working folder, the worker in the
background as in a terminal of its own; the run it asks for fills `out/nightly` on the embedded emulator.

Step 2's `export PREFECT_API_URL=...` is followed with the address of the server started here."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.prefect_server import (
    PrefectServer,
    base_environment,
    stop_process_group,
    wait_for,
)
from helpers.shared_servers import PrefectServers
from helpers.walkthroughs import examples, imagebatch_argv

ROOT = Path(__file__).resolve().parents[1]
BOUND = 600.0
"""Seconds a command, and then the run, get: generous (at a load average of 35 on 2 cores, the whole test
took 5 minutes)."""
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", name="prefect_harness")
def no_session_harness() -> None:
    """Overrides the session harness: everything here talks to the server below."""


@pytest.fixture
def server(prefect_servers: PrefectServers) -> PrefectServer:
    return prefect_servers.sqlite()


def as_process(argv: list[str]) -> list[str]:
    """A command of the page as this interpreter runs it (`uv run X` is the project's environment's X)."""
    if (args := imagebatch_argv(argv)) is not None:
        return [sys.executable, "-m", "imagebatch.cli.main", *args]
    assert argv[:3] == ["uv", "run", "prefect"], f"a command this test cannot follow: {argv}"
    return [sys.executable, "-m", "prefect", *argv[3:]]


def test_the_nightly_walkthrough_fills_its_output_folder(server: PrefectServer, tmp_path: Path) -> None:
    here = tmp_path / "clone"
    shutil.copytree(ROOT / "manifests" / "examples", here / "manifests" / "examples")
    env = base_environment({"PREFECT_HOME": str(tmp_path / "home"), "PREFECT_WORKER_QUERY_SECONDS": "1"})
    worker: subprocess.Popen[bytes] | None = None
    log = tmp_path / "worker.log"
    try:
        for argv in examples()["nightly"].commands():
            if argv[0] == "export":
                name, _, value = argv[1].partition("=")
                assert (name, value) == ("PREFECT_API_URL", "http://127.0.0.1:4200/api")  # step 1's server
                env[name] = server.api_url
            elif argv[-2:] == ["--pool", "imagebatch"] and argv[:3] == ["uv", "run", "imagebatch"]:
                with log.open("ab") as sink:  # in a terminal of its own
                    worker = subprocess.Popen(
                        as_process(argv), cwd=here, env=env, stdout=sink, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True,
                    )  # fmt: skip
            else:
                done = subprocess.run(
                    as_process(argv), cwd=here, env=env, capture_output=True, text=True, timeout=BOUND
                )
                assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
        assert worker is not None, "the walkthrough starts a worker"
        results = here / "out" / "nightly" / "results.csv"

        def finished() -> list[dict[str, str]]:
            if not results.is_file() or not (here / "out" / "nightly" / "run.json").is_file():
                return []
            with results.open() as table:
                return list(csv.DictReader(table))

        rows = wait_for("the deployment's run into out/nightly", finished, timeout=BOUND, log=log)
        assert len(rows) == 6 and {row["status"] for row in rows} == {"succeeded"}
        assert all((here / "out" / "nightly" / row["paths"]).is_file() for row in rows)
    finally:
        if worker is not None:
            stop_process_group(worker, 3)
