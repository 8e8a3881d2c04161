"""Prefect's temporary server as imagebatch starts it: its own session, a filtered environment, and never
outliving the run (issue 13: a `kill -9` of the run used to leave it listening for good)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from imagebatch.platform.prefect_server import TemporaryServer, prefect_api_configured, server_environment
from imagebatch.run.verdict import warnings

KEY = "sk-imagebatch-test-key-0123456789"

# Starts the temporary server as `imagebatch run` does, prints the server's pid as soon as it exists
# (`during-start`) or once it is healthy (`ready`), then waits to be killed.
SCRIPT = """
import os, sys, threading
import imagebatch
from imagebatch.platform.prefect_server import TemporaryServer
server = TemporaryServer().start()
if sys.argv[1] == "ready":
    server.wait_ready(timeout=120)
print(server.process.pid, os.getsid(server.process.pid) != os.getsid(0), "prefect" in sys.modules, flush=True)
threading.Event().wait()
"""


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway Prefect home (and database) for this module's servers: migrated once, by the first."""
    return tmp_path_factory.mktemp("prefect-home")


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


@pytest.mark.slow  # a process of its own
@pytest.mark.parametrize("when", ["during-start", "ready"])
def test_a_killed_run_leaves_no_prefect_server(prefect_home: Path, when: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(prefect_home)
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
        server_pid, own_session, imported = int(line.split()[0]), line.split()[1] == "True", line.split()[2]
        assert own_session  # Ctrl-C in the terminal reaches only imagebatch
        assert imported == "False"  # started without importing Prefect in the run's own process
        assert _alive(server_pid)
        # The key never reaches the server's environment (where /proc/PID/environ would show it).
        environ = Path(f"/proc/{server_pid}/environ").read_bytes()
        assert KEY.encode() not in environ and b"IMAGEBATCH_API_KEY" not in environ
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert _wait_gone(server_pid, timeout=60), f"the Prefect server {server_pid} outlived its parent"
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


def test_prefect_already_imported_is_asked_itself(prefect: str) -> None:
    assert prefect_api_configured()  # the session harness sets PREFECT_API_URL in Prefect's settings


def test_a_configured_prefect_api_is_found_without_importing_prefect(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    env = {"PREFECT_HOME": str(home)}
    assert not prefect_api_configured(env, cwd)  # nothing anywhere: start a temporary server
    assert prefect_api_configured({**env, "PREFECT_API_URL": "http://127.0.0.1:4200/api"}, cwd)
    profiles = home / "profiles.toml"
    profiles.write_text('active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://127.0.0.1:4200/api"\n')
    assert prefect_api_configured(env, cwd)
    assert not prefect_api_configured({**env, "PREFECT_PROFILE": "ephemeral"}, cwd)
    profiles.write_text("not toml [")
    assert not prefect_api_configured(env, cwd)
    (cwd / ".env").write_text("PREFECT_API_URL=http://127.0.0.1:4200/api\n")
    assert prefect_api_configured(env, cwd)


@pytest.mark.slow  # a process of its own
def test_the_temporary_server_answers_and_stops(prefect_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(prefect_home)
    env["IMAGEBATCH_API_KEY"] = KEY
    server = TemporaryServer(env).start()
    try:
        url = server.wait_ready(timeout=120)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/api")
        pid = server.process.pid if server.process else 0
        assert KEY.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    finally:
        server.stop()
    assert server.process is None and _wait_gone(pid, timeout=30)  # stop: 3 s of grace, then SIGKILL


@pytest.mark.slow  # a process of its own
def test_a_run_without_a_prefect_api_starts_its_own_server_and_leaves_none(
    prefect_home: Path, out: Path
) -> None:
    """The quick start's path: `imagebatch run` with no Prefect API configured, as its own process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "IMAGEBATCH_"))}
    env["PREFECT_HOME"] = str(prefect_home)
    examples = Path(__file__).resolve().parents[2] / "manifests" / "examples"
    cmd = [
        sys.executable,
        "-m",
        "imagebatch.cli.main",
        "run",
        str(examples / "catalog.csv"),
        "--out",
        str(out),
    ]
    before = set(_servers(prefect_home))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["state"] == "finished" and run["prefect"]["flow_run_id"]
    assert set(_servers(prefect_home)) <= before  # its temporary server stopped with it


def _servers(home: Path) -> list[int]:
    """Pids of the temporary servers running now (`python -m imagebatch.platform.prefect_server ...`) on
    PREFECT_HOME `home`: only this test's, not those other test processes on the machine start meanwhile."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            ours = f"PREFECT_HOME={home}".encode() in environ
            if b"imagebatch.platform.prefect_server" in args and ours and _alive(int(proc.name)):
                pids.append(int(proc.name))
    return pids


def test_a_run_on_the_temporary_server_sends_no_heartbeats() -> None:
    """Nothing reads a temporary server's heartbeats; with them on, a run's end waits up to 1 s for them."""
    from prefect.settings import Settings, get_current_settings, temporary_settings

    from imagebatch.cli.terminal import _temporary_server_settings

    assert Settings().flows.heartbeat_frequency is not None  # Prefect's default: on
    with temporary_settings(_temporary_server_settings("http://127.0.0.1:1/api")):
        settings = get_current_settings()
        assert settings.api.url == "http://127.0.0.1:1/api"
        assert settings.flows.heartbeat_frequency is None


@pytest.mark.slow  # a process of its own
def test_the_wait_for_the_temporary_server_imports_what_the_flow_will_need() -> None:
    code = (
        "import sys\n"
        "from imagebatch.cli.terminal import _warm_imports\n"
        "wanted = {'prefect.flow_engine', 'fastapi.encoders', 'uvicorn.server', 'PIL.ImageDraw'}\n"
        "before = wanted & set(sys.modules)\n"
        "_warm_imports(emulator=True, report=True)\n"
        "after = wanted - set(sys.modules)\n"
        "print(sorted(before), sorted(after))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["[]", "[]"]  # none imported before; all of them after


DIES_WITH_PARENT = """
import subprocess, sys
code = "import os, sys, threading; from imagebatch.platform.prefect_server import die_with_parent; "
code += "print(die_with_parent(int(sys.argv[1])), flush=True); threading.Event().wait()"
child = subprocess.Popen([sys.executable, "-c", code, str(__import__("os").getpid())], stdout=subprocess.PIPE)
print(child.pid, child.stdout.readline().decode().strip(), flush=True)
child.stdout.close()
__import__("threading").Event().wait()
"""


@pytest.mark.slow  # a process of its own
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_kernel_kills_the_server_with_its_parent() -> None:
    """Issue 21 #9: the watchdog's poll took about 2 s on a loaded machine; the kernel's parent-death
    signal needs no poll. A process that asked for it and has no watchdog dies with its parent."""
    parent = subprocess.Popen([sys.executable, "-c", DIES_WITH_PARENT], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert parent.stdout is not None
        child_pid, asked = parent.stdout.readline().split()
        child = int(child_pid)
        assert asked == "True" and _alive(child)
        parent.kill()
        parent.wait(timeout=30)
        assert _wait_gone(child, timeout=60), "the child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
        if parent.stdout:
            parent.stdout.close()


END_BOUND = 30.0
"""Seconds a run may take from its summary's last line to its exit on a loaded machine (the issue saw
70 s of the log client's retries against the stopped server; a quiet machine takes about one)."""


def test_a_run_with_failures_prints_nothing_after_its_summary_and_exits_soon(
    prefect_home: Path, tmp_path: Path, service_env: Any
) -> None:
    """Issue 29 #12: Prefect's log shipping outlived the temporary server: `--- Error logging to API ---`
    after the summary, and the exit held for about 70 s. Now the logs are sent (`end_shipping`) before
    the summary, with the server up."""
    service_env.set_faults(scripts=[{"outcomes": ["no_image"], "match": "teapot"}])
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,prompt\ng1,a vase\ng2,a teapot\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "IMAGEBATCH_"))}
    env |= {"PREFECT_HOME": str(prefect_home), "IMAGEBATCH_BASE_URL": service_env.url,
            "IMAGEBATCH_API_KEY": service_env.api_key}  # fmt: skip
    cmd = [sys.executable, "-m", "imagebatch.cli.main", "run", str(manifest), "--out", str(tmp_path / "out")]
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    summary_at = None
    try:
        assert child.stdout is not None
        for line in child.stdout:  # ends when the process closes its output: at its exit
            lines.append(line.rstrip("\n"))
            if line.startswith("report: "):
                summary_at = time.monotonic()
        child.wait(timeout=END_BOUND)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert summary_at is not None, "\n".join(lines)
    assert time.monotonic() - summary_at < END_BOUND
    assert child.returncode == 1  # a request answered without an image
    # The summary ends with the report's line and then the run's own warnings (run.verdict.warnings, the
    # words the flow run's log has too): nothing after them.
    shown = [line for line in lines if line.strip()]
    report = max(i for i, line in enumerate(shown) if line.startswith("report: "))
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert shown[report + 1 :] == list(warnings(info))
    assert any("no_image" in line for line in shown[report + 1 :])
    assert not [line for line in lines if "Error logging to API" in line]
