"""Prefect's temporary server as imagebatch starts it: its own session, a filtered environment, and never
outliving the run (issue 13: a `kill -9` of the run used to leave it listening for good)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imagebatch.flows.prefect_server import detach_ephemeral_prefect_server, server_environment

KEY = "sk-imagebatch-test-key-0123456789"

# Starts the detached server as `imagebatch run` does, prints the server's pid as soon as it exists
# (`during-start`) or once it is healthy (`ready`), then waits to be killed.
SCRIPT = """
import os, sys, threading, time
import imagebatch.flows
from imagebatch.flows.prefect_server import detach_ephemeral_prefect_server
server = detach_ephemeral_prefect_server()
when = sys.argv[1]
if when == "ready":
    server.start(timeout=120)
    print(server.server_process.pid, os.getsid(server.server_process.pid) != os.getsid(0), flush=True)
else:
    threading.Thread(target=server.start, kwargs={"timeout": 120}, daemon=True).start()
    while getattr(server, "server_process", None) is None:
        time.sleep(0.005)
    print(server.server_process.pid, True, flush=True)
threading.Event().wait()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _wait_gone(pid: int, timeout: float) -> bool:
    """Wait (polling a real process, which no fake clock can speed up) until `pid` has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("when", ["during-start", "ready"])
def test_a_killed_run_leaves_no_prefect_server(tmp_path: Path, when: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")  # a throwaway database for this server
    env["IMAGEBATCH_API_KEY"] = KEY
    parent = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, when],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    server_pid = 0
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line, parent.stderr.read() if parent.stderr else ""
        server_pid, own_session = int(line.split()[0]), line.split()[1] == "True"
        assert own_session  # Ctrl-C in the terminal reaches only imagebatch
        assert _alive(server_pid)
        # The key never reaches the server's environment (where /proc/PID/environ would show it).
        environ = Path(f"/proc/{server_pid}/environ").read_bytes()
        assert KEY.encode() not in environ and b"IMAGEBATCH_API_KEY" not in environ
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert _wait_gone(server_pid, timeout=20), f"the Prefect server {server_pid} outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        if server_pid and _alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
        for stream in (parent.stdout, parent.stderr):
            if stream:
                stream.close()


def test_the_server_gets_prefects_settings_and_the_basics_only() -> None:
    environ = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "IMAGEBATCH_API_KEY": KEY,
        "AWS_SECRET_ACCESS_KEY": "x",
        "PREFECT_HOME": "/tmp/p",
    }
    env = server_environment(environ, {"PREFECT_SERVER_API_PORT": "4200"})
    assert env["PATH"] == "/usr/bin" and env["PREFECT_HOME"] == "/tmp/p"
    assert env["PREFECT_SERVER_API_PORT"] == "4200"
    assert "IMAGEBATCH_API_KEY" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert KEY not in "".join(env.values())


def test_no_detached_server_when_a_prefect_api_is_configured() -> None:
    assert detach_ephemeral_prefect_server() is None  # the session harness sets PREFECT_API_URL
