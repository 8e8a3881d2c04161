"""Prefect's temporary server, when a run needs one: started in its own session, with only the environment
it needs, and watching its parent so that it never outlives the run.

- Its own session: the terminal's Ctrl-C reaches only imagebatch, which stops gracefully; a server killed
  by the same Ctrl-C dies in the middle of writing task states and the run, which can no longer report to
  it, hangs.
- Its own environment: a copy of ours would put `IMAGEBATCH_API_KEY` into its `/proc/PID/environ`.
- A watchdog: a process in its own session survives its parent's `kill -9`; this one exits within about
  half a second of its parent's death, from the first line of its start-up on.

Run as `python -m imagebatch.flows.prefect_server PARENT_PID UVICORN_ARGS...`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

# What the server process is given of our environment: Prefect's settings and what Python itself needs.
_PASSED_ON = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TEMP", "TMP",
              "PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV", "SSL_CERT_FILE",
              "SSL_CERT_DIR", "DO_NOT_TRACK")  # fmt: skip


def server_environment(environ: dict[str, str], settings: dict[str, str]) -> dict[str, str]:
    """The server's environment: Prefect's variables and the basics, nothing else of ours."""
    env = {k: v for k, v in environ.items() if k in _PASSED_ON or k.startswith("PREFECT_")}
    return {
        **env,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        **settings,
    }


def detach_ephemeral_prefect_server() -> Any:
    """Register a detached, watched temporary server, when Prefect would start one.

    Prefect's own test harness registers its server the same way (the `None` key of
    `SubprocessASGIServer._instances`). Returns the server object, or None when a Prefect API is
    configured (nothing to start) or a server is already registered.
    """
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    import prefect
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    if None in SubprocessASGIServer._instances:
        return None

    class DetachedServer(SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
            # prefect 3.8.8's command (pinned in pyproject.toml), behind our watchdog, in a new session.
            settings = get_current_settings().to_environment_variables(exclude_unset=True)
            env = server_environment(dict(os.environ), settings)
            app_dir = str(prefect.__module_path__.parent)
            cmd = [sys.executable, "-m", __name__, str(os.getpid()), "--app-dir", app_dir, "--factory"]
            cmd += ["prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port)]
            cmd += ["--log-level", "error", "--lifespan", "on"]
            return subprocess.Popen(cmd, env=env, start_new_session=True)

    return DetachedServer()


def watch_parent(parent_pid: int, interval: float = 0.5) -> threading.Thread:
    """Exit this process at once when `parent_pid` is no longer its parent (it died: we were reparented)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(0)  # SQLite rolls back a write this cuts short

    thread = threading.Thread(target=watch, name="imagebatch-parent-watchdog", daemon=True)
    thread.start()
    return thread


def main(argv: list[str]) -> None:
    """`PARENT_PID UVICORN_ARGS...`: watch the parent, then run uvicorn in this process."""
    watch_parent(int(argv[0]))
    from uvicorn.main import main as uvicorn_main

    uvicorn_main(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
