"""The suite's Prefect is its own, and what it starts ends with it: a test run in a machine whose
environment names another Prefect (PREFECT_HOME with an active profile, PREFECT_API_URL, PREFECT_PROFILE)
uses its own home and the session's harness, and a SIGTERM of that test run stops the harness's server
and a server the helpers started. The test run is a real `pytest` process with this suite's conftest.py;
every wait is for an event, bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.prefect_server import base_environment, wait_for

pytestmark = pytest.mark.slow  # the inner test run starts the harness and a server

TESTS = Path(__file__).resolve().parent
ELSEWHERE = "http://127.0.0.1:9/api"  # nothing listens there
PROFILES = f"""active = "there"

[profiles.there]
PREFECT_API_URL = "{ELSEWHERE}"
PREFECT_LOGGING_LEVEL = "DEBUG"
"""

INNER_CONFTEST = f"""
import importlib.util, sys
sys.path.insert(0, {str(TESTS)!r})
spec = importlib.util.spec_from_file_location("suite_conftest", {str(TESTS / "conftest.py")!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
globals().update({{k: v for k, v in vars(suite).items() if not k.startswith("__")}})
"""

INNER_TEST = """
import os, threading
from pathlib import Path
from helpers.prefect_server import running_prefect_server

def test_holds_two_servers(prefect, tmp_path):
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME

    harness = SubprocessASGIServer._instances[None].server_process.pid
    with running_prefect_server(tmp_path / "server") as server:
        seen = [harness, server.pid, PREFECT_HOME.value(), PREFECT_API_URL.value(), prefect]
        Path(os.environ["SEEN"]).write_text(" ".join(map(str, seen)))
        threading.Event().wait(600)  # until the test run is stopped
"""


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_sigterm_of_a_test_run_elsewhere_stops_the_servers_it_started(tmp_path: Path) -> None:
    inner, elsewhere, seen = tmp_path / "inner", tmp_path / "elsewhere", tmp_path / "seen"
    inner.mkdir(), elsewhere.mkdir()
    (inner / "conftest.py").write_text(INNER_CONFTEST)
    (inner / "test_inner.py").write_text(INNER_TEST)
    (elsewhere / "profiles.toml").write_text(PROFILES)
    env = base_environment({"PREFECT_HOME": str(elsewhere), "PREFECT_API_URL": ELSEWHERE, "SEEN": str(seen)})
    env["PREFECT_PROFILE"] = "there"
    cmd = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q", str(inner)]
    log = tmp_path / "inner.log"
    with open(log, "wb") as out:
        run = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    pids: list[int] = []
    try:
        wait_for("the inner test holding its servers", lambda: seen.exists() and seen.read_text(),
                 timeout=300, log=log)  # fmt: skip
        harness, server, home, api, harness_api = seen.read_text().split()
        pids = [int(harness), int(server)]
        assert Path(home).name.startswith("imagebatch-tests-prefect-") and api == harness_api != ELSEWHERE
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=120)
        wait_for("the servers stopped", lambda: not any(map(running, pids)), timeout=60, log=log)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in filter(running, pids):
            os.kill(pid, signal.SIGKILL)
