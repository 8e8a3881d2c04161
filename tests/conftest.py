"""Shared fixtures: one emulator server over real HTTP for the whole test session.

def test_something(emulator):            # a fresh-state handle on the session's server
    emulator.set_faults(scripts=[[503, 503]])   # first two attempts of every Idempotency-Key: 503
    httpx.post(emulator.url + "/v1/images/generations",
               headers={"Authorization": f"Bearer {emulator.api_key}"}, json={"prompt": "a cat"})
    assert len(emulator.ledger()) == 0 ...

Also: the `slow` marker (a test that needs a Prefect server, a worker or a browser, or takes seconds; see
`pytest_collection_modifyitems`), so `uv run pytest -m "not slow"` is the quick inner loop; the session's
Prefect harness and a run's environment (`prefect`, `service_env`); S3 on moto (`s3`).

Prefect's settings are the suite's own, whatever the machine's environment holds: see `_own_prefect_home`.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _own_prefect_home() -> None:
    """Every `PREFECT_*` variable of the environment dropped (PREFECT_API_URL, PREFECT_PROFILE,
    PREFECT_HOME, a logging level...), and a fresh, empty PREFECT_HOME of this test process's (each xdist
    worker makes its own), so no profile of the machine's is read: Prefect reads its settings once, at its
    import, which comes after this (conftest.py is imported before any test module). A test that talks
    to Prefect uses the session's harness (`prefect`) or a server of its own (tests/helpers), and the
    processes it starts get exactly the settings they need (`helpers.prefect_server.base_environment`)."""
    assert "prefect" not in sys.modules, "Prefect was imported before tests/conftest.py"
    for name in [n for n in os.environ if n.startswith("PREFECT_")]:
        del os.environ[name]
    home = Path(tempfile.mkdtemp(prefix="imagebatch-tests-prefect-"))
    os.environ["PREFECT_HOME"] = str(home)
    os.environ["PREFECT_PROFILES_PATH"] = str(home / "profiles.toml")
    atexit.register(shutil.rmtree, home, True)


_own_prefect_home()

import pytest  # noqa: E402 - after the environment is the suite's own
from helpers.emulator import emulator_settings  # noqa: E402

import imagebatch  # noqa: E402 - sets Prefect's environment defaults before Prefect is imported
from imagebatch.emulator import EmulatorServer  # noqa: E402


@pytest.fixture(scope="session")
def emulator_server() -> Iterator[EmulatorServer]:
    """The session's emulator: an `EmulatorServer` on 127.0.0.1 with a free port, in a thread.

    Settings: `helpers.emulator.emulator_settings()`: `api_key="test-emulator-key"`, `seed=0`, no latency,
    `slow_seconds=0.5`, default image mix (`jpeg_rate=0.25`, `max_images_policy="random"`), no faults.
    Prefer the function-scoped `emulator` fixture, which resets this server's state before each test.
    """
    with EmulatorServer(emulator_settings()) as server:
        yield server


@pytest.fixture
def emulator(emulator_server: EmulatorServer) -> Iterator[EmulatorServer]:
    """The session's `EmulatorServer`, reset: empty ledger and request log, no attempts counted, the
    session settings above and no faults. Changes a test makes are undone by the next test's reset.

    Handle API (see `imagebatch.emulator.server.EmulatorServer`):
      - `url`: the service root, e.g. `http://127.0.0.1:54321`; `api_key`.
      - `ledger(idempotency_key=None)`: billed generations, dicts with `seq, time, route, model, images,
        usage, idempotency_key, request_id, status (int or "drop"), fault, attempt, prompt`.
      - `requests()`: every request received on a service path, dicts with `seq, time, method, path,
        request_id, idempotency_key, route, model, attempt, fault, status`.
      - `set_faults(rates={503: 0.1}, scripts=[[503, "ok"], {"outcomes": ["drop"], "match": "cat"}])`:
        replace the faults; outcomes are 401 402 408 409 425 429 500 502 503, "slow", "drop",
        "no_image" (and "ok" in scripts).
      - `configure(latency=..., jpeg_rate=..., max_images_policy="cap", thought_image_rate=...,
        slow_seconds=...)`: change settings for this test.
      - `reset()`, `attempts()`, `state` (the app's `EmulatorState`).
    The same operations exist over HTTP under `{url}/emulator/` (see the emulator README).
    """
    emulator_server.reset()
    yield emulator_server
    emulator_server.reset()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[object]:
    """A real S3-compatible server (moto) on 127.0.0.1 for the session: see tests/helpers/s3.py."""
    from helpers.s3 import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server: object, monkeypatch: pytest.MonkeyPatch) -> object:
    """The session's S3 server, its address and a valid key in the standard AWS_* variables."""
    for name, value in s3_server.env().items():  # type: ignore[attr-defined]
        monkeypatch.setenv(name, value)
    return s3_server


# --- the end of the test run ------------------------------------------------------------------------


def _interrupted(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM of the test run (a CI timeout, `timeout`, `kill`) ends it as Ctrl-C does: fixtures torn
    down, `pytest_sessionfinish` and the exit handlers run, so the Prefect servers and workers its tests
    started are stopped; Python's default for SIGTERM ends the process at once and left them running."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupted)
    if not hasattr(config, "workerinput"):  # the controller (or the one process of `-n 0`), once
        _COMPILED.extend(_compile_the_sources())


def pytest_unconfigure(config: pytest.Config) -> None:
    """The bytecode `pytest_configure` wrote, removed: the checkout is left as the run found it."""
    for path in _COMPILED:
        with contextlib.suppress(OSError):
            path.unlink()
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # only if empty: a cache Python or the user made stays
    _COMPILED.clear()


_COMPILED: list[Path] = []


def _compile_the_sources() -> list[Path]:
    """imagebatch's own bytecode, compiled once for the run when Python would write none
    (PYTHONDONTWRITEBYTECODE=1, as on these machines; `uv sync --compile-bytecode` compiles the installed
    packages, not the project's editable source): otherwise each of the hundreds of Python processes the
    tests start (flow runs, workers, commands, shards) compiles the modules it imports again, about 0.3
    CPU s each. Returns the files written, which `pytest_unconfigure` removes."""
    import compileall

    if not sys.dont_write_bytecode:
        return []  # Python caches it itself
    package = Path(imagebatch.__file__).parent
    before = set(package.rglob("*.pyc"))
    compileall.compile_dir(package, quiet=1)
    return sorted(set(package.rglob("*.pyc")) - before)


def pytest_report_header() -> str | None:
    """A line at the top of the run when Prefect has no bytecode and Python will write none
    (PYTHONDONTWRITEBYTECODE=1, as on these machines, after a `uv sync` without `--compile-bytecode`):
    then every Python process the tests start (servers, workers, flow runs, commands) compiles Prefect
    again: importing the flow took 4.4 CPU s against 2.1 compiled, and a run of the whole suite starts
    hundreds of such processes. CI compiles at install (.ci/run); a slow local run says why here."""
    import importlib.util

    spec = importlib.util.find_spec("prefect")
    if not sys.dont_write_bytecode or spec is None or spec.origin is None:
        return None
    if os.path.exists(importlib.util.cache_from_source(spec.origin)):
        return None
    return (
        "Prefect's bytecode is not compiled and PYTHONDONTWRITEBYTECODE is set: every Python process the "
        "tests start compiles it again (about 2 CPU s each); `uv sync --locked --compile-bytecode` once "
        "makes the suite quicker"
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After the fixtures' teardown (in every xdist worker too): the servers and workers the helpers
    started that are still running, stopped (`helpers.prefect_server.stop_started`)."""
    from helpers.prefect_server import stop_started

    stop_started()


# --- the Prefect servers the platform tests share ------------------------------------------------------

SHARED_SERVERS = "prefect_servers"


@pytest.fixture(scope="session", name=SHARED_SERVERS)
def shared_prefect_servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """This test process's `prefect server start`s, one per database, emptied for each file that asks
    (`helpers.shared_servers`); stopped at the end of a file that did not use them or before one that
    uses none (below)."""
    from helpers.shared_servers import PrefectServers

    servers = PrefectServers(tmp_path_factory.mktemp("prefect-servers"))
    request.config.stash[_SERVERS] = servers
    try:
        yield servers
    finally:
        servers.stop()


_SERVERS = pytest.StashKey[Any]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test of a file (its module's fixtures torn down), the shared servers it did not use
    stopped, and all of them when the next file uses none (`PrefectServers.file_ended`)."""
    try:
        return (yield)
    finally:
        servers = item.config.stash.get(_SERVERS, None)
        if servers is not None and (nextitem is None or _file(nextitem) != _file(item)):
            users = item.config.stash.get(_SERVER_FILES, set())
            servers.file_ended(next_file_uses_one=nextitem is not None and _file(nextitem) in users)


_SERVER_FILES = pytest.StashKey[set[str]]()
"""The test files some test of which uses the shared servers (`pytest_collection_modifyitems`)."""


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


# --- the slow tests ------------------------------------------------------------------------------------

SLOW_FIXTURES = frozenset({"prefect_harness", "browser"})
"""A test that uses one of these is `slow`: the session's Prefect server (about 10 s to start, seconds a run)
or a real browser. Tests that start servers, workers or browsers of their own say so with
`pytest.mark.slow` (a module's `pytestmark`)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `slow` every test that uses a slow fixture, in this one place rather than on each test; note
    the files that use the shared Prefect servers; then order the files slowest first (`_slow_first`)."""
    server_files = config.stash[_SERVER_FILES] = set()
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if SLOW_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.slow)
        if SHARED_SERVERS in fixtures:
            server_files.add(_file(item))
    _slow_first(items, server_files)


def _slow_first(items: list[pytest.Item], server_files: set[str]) -> None:
    """Files whose every test is slow first, then those with some, then the rest, and in each the files
    that use the shared Prefect servers first (so that a server seldom starts twice); each file's tests
    together and in their order. pytest-xdist hands each worker the next file as it finishes one (`--dist
    loadfile` with `--no-loadscope-reorder`, pyproject.toml; its default order, most tests first, put the
    long files of few tests last): ending on short files, the two workers finish together. In a simulation
    from one run's test times (each file's time varied by -25 %..+35 %), the slower worker ended 15 s after
    the mean the old way (32 s in one run in ten), 2 s this way."""
    slow: dict[str, list[bool]] = {}
    for item in items:
        slow.setdefault(_file(item), []).append(item.get_closest_marker("slow") is not None)

    def group(item: pytest.Item) -> tuple[int, bool]:
        marks = slow[_file(item)]
        return 0 if all(marks) else 1 if any(marks) else 2, _file(item) not in server_files

    items.sort(key=group)  # stable: a file's tests stay together, in order


# --- runs of the flow (tests/flows, tests/report) ---------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "examples"


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[str]:
    """One temporary Prefect server and database for the whole session (it takes ~10 s to start), with no
    flow-run heartbeats, as `imagebatch run` has on its temporary server (`cli.terminal`): nothing reads
    them, and with them on each run's end waits up to a second for the heartbeat thread."""
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.testing import utilities

    with contextlib.ExitStack() as stack:
        with pytest.MonkeyPatch.context() as patch:  # only while the harness makes its folder
            patch.setattr(utilities, "mkdtemp", _folder_with_the_template_database)
            stack.enter_context(utilities.prefect_test_harness(server_startup_timeout=120))
        stack.enter_context(temporary_settings({"flows.heartbeat_frequency": None}))
        yield str(PREFECT_API_URL.value())
        _prefect_console_writes_to(sys.__stderr__)  # its "Stopping" line: not to the last test's capture


def _folder_with_the_template_database() -> str:
    """The harness's temporary folder (Prefect's helper makes it with `mkdtemp`), holding the database
    imagebatch ships for its temporary server (`platform.prefect_template`) under the name the harness
    gives its SQLite file: its server then starts on a schema at Alembic's head instead of running every
    migration (about 6 CPU s of each start). If Prefect renames the file, the copy is unused: the harness
    builds its database as before."""
    from imagebatch.platform.prefect_template import template_path

    folder = tempfile.mkdtemp()
    if template_path().is_file():
        with gzip.open(template_path()) as template, open(Path(folder) / "prefect-test.db", "wb") as db:
            shutil.copyfileobj(template, db)
    return folder


@pytest.fixture
def prefect(prefect_harness: str, restore_logging: None) -> str:
    """A test that runs the flow or talks to Prefect: the session's harness (its API URL), and the loggers
    `run` quiets restored after the test."""
    return prefect_harness


@pytest.fixture
def service_env(emulator: Any, prefect: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A run's environment: the session's Prefect harness (`prefect`), and the session emulator's address
    and key in the environment (never a flow parameter)."""
    monkeypatch.setenv("IMAGEBATCH_BASE_URL", emulator.url)
    monkeypatch.setenv("IMAGEBATCH_API_KEY", emulator.api_key)
    emulator.configure(jpeg_rate=0.0, thought_image_rate=0.3)
    return emulator


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """A run's output folder, `out` in the test's tmp folder (not made: the run makes it)."""
    return tmp_path / "out"


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """A copy of manifests/examples in a tmp folder (tests may edit it)."""
    dest = tmp_path / "examples"
    shutil.copytree(EXAMPLES, dest)
    return dest


QUIETED_LOGGERS = ("prefect.task_runs", "prefect.flow_runs", "prefect", "httpx", "uvicorn")


@pytest.fixture
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`run` quiets Prefect's loggers for the terminal; undo that so other tests' caplog still sees INFO."""
    levels = {name: logging.getLogger(name).level for name in QUIETED_LOGGERS}
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING"))
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture(autouse=True)
def _prefect_console_writes_to_this_tests_stderr() -> None:
    """Prefect binds its console log handler to `sys.stderr` as it is when Prefect first sets logging
    up; in a test run under `capsys` that is the test's capture, closed once the test ends, and a later
    test's warning then ends in a logging traceback on its own stderr. A process of imagebatch's never
    swaps `sys.stderr`, so this is the tests' concern: each test starts with the handler on the stderr
    of the moment."""
    _prefect_console_writes_to(sys.stderr)


def _prefect_console_writes_to(stream: Any) -> None:
    handlers_module = sys.modules.get("prefect.logging.handlers")
    if handlers_module is None:
        return
    console_handler = handlers_module.PrefectConsoleHandler
    for logger in (logging.getLogger(), *(logging.getLogger(name) for name in QUIETED_LOGGERS)):
        for handler in logger.handlers:
            if isinstance(handler, console_handler):
                handler.stream = stream  # not setStream: it flushes the old one, maybe closed
                handler.console.file = stream
