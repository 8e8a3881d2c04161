"""Prefect's temporary server, when a run needs one (no `PREFECT_API_URL`): started first, in parallel with
the run's own start-up, in its own session, with only the environment it needs, and watching its parent so
that it never outlives the run.

- Its own session: the terminal's Ctrl-C reaches only imagebatch, which stops gracefully; a server killed
  by the same Ctrl-C dies in the middle of writing task states and the run, which can no longer report to
  it, hangs.
- Its own environment: a copy of ours would put `IMAGEBATCH_API_KEY` into its `/proc/PID/environ`.
- Dies with its parent: a process in its own session survives its parent's `kill -9`. On Linux the kernel
  kills this one at once when the run dies (`PR_SET_PDEATHSIG`, asked for when the run's main thread
  starts it: the signal follows the thread that started it); elsewhere, and as a fallback, a watchdog
  thread polling its parent pid exits it within about half a second (a second or two on a machine
  loaded 6 deep), from the first line of its start-up on.

Run as `python -m imagebatch.platform.prefect_server PARENT_PID[:die-with-parent] UVICORN_ARGS...`.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path

from imagebatch.platform.prefect_template import seed_database
from imagebatch.run.exit_codes import EXIT_OK

# What the server process is given of our environment: Prefect's settings and what Python itself needs.
_PASSED_ON = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TEMP", "TMP",
              "PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV", "SSL_CERT_FILE",
              "SSL_CERT_DIR", "DO_NOT_TRACK")  # fmt: skip


def server_environment(environ: Mapping[str, str], settings: dict[str, str]) -> dict[str, str]:
    """The server's environment: Prefect's variables and the basics, nothing else of ours."""
    env = {k: v for k, v in environ.items() if k in _PASSED_ON or k.startswith("PREFECT_")}
    return {
        **env,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        **settings,
    }


def prefect_api_configured(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> bool:
    """Whether Prefect has a server of its own to talk to (`PREFECT_API_URL`), so no temporary one is needed.

    Read without importing Prefect (that takes seconds, and the point is to start the server first): the
    environment, the active profile, and a `prefect.toml`, `.env` or `[tool.prefect]` in the working
    folder. Where one of those may set it, the answer is yes; the run then asks Prefect's own settings
    and, if the answer was wrong, starts the server later rather than one too many.
    """
    if environ is None and "prefect.settings" in sys.modules:  # already imported: ask Prefect itself
        from prefect.settings import PREFECT_API_URL

        return bool(PREFECT_API_URL.value())
    environ = os.environ if environ is None else environ
    if environ.get("PREFECT_API_URL"):
        return True
    cwd = Path.cwd() if cwd is None else cwd
    if (cwd / "prefect.toml").is_file() or _mentions(cwd / ".env", "PREFECT_API_URL"):
        return True
    if _mentions(cwd / "pyproject.toml", "[tool.prefect"):
        return True
    home = Path(environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    profiles = Path(environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        data = tomllib.loads(profiles.read_text())
    except (OSError, ValueError):
        return False
    active = environ.get("PREFECT_PROFILE") or data.get("active") or "ephemeral"
    return "PREFECT_API_URL" in data.get("profiles", {}).get(active, {})


def _mentions(path: Path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False


class TemporaryServer:
    """Prefect's server for one run (what Prefect itself would start, "ephemeral"), started by us, at once.

    `start` returns as soon as the process exists: the run's imports and its manifest check go on while
    the server starts (on a second core). The run process never imports `prefect.server` (seconds of its
    own start-up); it points Prefect at `api_url` once `wait_ready` returns. `stop` runs at exit, after
    Prefect's own exit handlers have sent their last logs and events (it is registered before Prefect is
    imported, and exit handlers run last-registered first).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> TemporaryServer:
        spec = importlib.util.find_spec("prefect")  # finds Prefect without importing it
        if spec is None or spec.origin is None:
            raise RuntimeError("prefect is not installed")
        app_dir = str(Path(spec.origin).parent.parent)
        seed_database(
            self.environ
        )  # an empty Prefect home gets a ready database (`platform.prefect_template`)
        self.port = _free_port()
        parent = str(os.getpid())
        if threading.current_thread() is threading.main_thread():  # it lives as long as the run
            parent += ":die-with-parent"
        cmd = [sys.executable, "-m", __name__, parent, "--app-dir", app_dir, "--factory"]
        cmd += ["prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--log-level", "error", "--lifespan", "on"]
        self.process = subprocess.Popen(cmd, env=server_environment(self.environ, {}), start_new_session=True)
        atexit.register(self.stop)
        return self

    def wait_ready(
        self,
        timeout: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> str:
        """Wait until the server answers its health check; return its API URL. A port taken meanwhile
        (uvicorn exits with 3) is tried again on another."""
        import httpx

        deadline = clock() + timeout
        with httpx.Client(timeout=2.0) as client:
            while clock() < deadline:
                assert self.process is not None
                code = self.process.poll()
                if code == 3:  # the port was taken between our look and uvicorn's bind
                    self.start()
                    continue
                if code is not None:
                    raise RuntimeError(f"Prefect's temporary server exited with code {code} while starting")
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        return self.api_url
                sleep(0.05)
        self.stop()
        raise RuntimeError(f"Prefect's temporary server did not start within {timeout:g} s")

    def stop(self, grace: float = 3.0) -> None:
        """Stop the server: SIGTERM (it finishes what it is writing), SIGKILL after `grace` seconds."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill(process)

    def kill(self, process: subprocess.Popen[bytes] | None = None) -> None:
        """Stop it at once (a second Ctrl-C): SQLite rolls back a write this cuts short."""
        process = process or self.process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


SHIPPING_GRACE = 3.0
"""Seconds the end of a run on the temporary server gives Prefect's log and event workers to send what
they still hold, while the server is up to take it."""


def end_shipping(timeout: float = SHIPPING_GRACE) -> None:
    """Send what Prefect's log and event workers still hold, then stop them and ship no more logs: called
    at the end of a run on the temporary server, before its summary and before the server stops.

    Left to Prefect's exit handlers, they would send the run's last logs to a server already stopped:
    `--- Error logging to API --- All connection attempts failed` printed after the summary, and the
    client's retries holding the exit for about 70 s. A log emitted after this goes nowhere (the API
    log sink is a no-op), so no worker is started again for the exit handlers to wait on."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker, set_api_log_sink

    set_api_log_sink(lambda _log: None)
    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=timeout, at_exit=False)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def watch_parent(parent_pid: int, interval: float = 0.5) -> threading.Thread:
    """Exit this process at once when `parent_pid` is no longer its parent (it died: we were reparented)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(EXIT_OK)  # SQLite rolls back a write this cuts short

    thread = threading.Thread(target=watch, name="imagebatch-parent-watchdog", daemon=True)
    thread.start()
    return thread


def die_with_parent(parent_pid: int) -> bool:
    """Linux: have the kernel SIGKILL this process as soon as its parent (the thread of it that started
    this process) dies; return whether it could. Costs nothing while the parent lives."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        done = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:  # it died before we asked
        os._exit(EXIT_OK)
    return done


PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    """`PARENT_PID[:die-with-parent] UVICORN_ARGS...`: watch the parent, then run uvicorn here."""
    pid, _, how = argv[0].partition(":")
    if how == "die-with-parent":
        die_with_parent(int(pid))
    watch_parent(int(pid))
    from uvicorn.main import main as uvicorn_main

    uvicorn_main(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
