"""`imagebatch run` on a terminal: the checks before Prefect starts, the temporary server, Ctrl-C and
SIGTERM, and the end of the command. What it prints (the progress bar, the summary, the exit code it
decides) is `cli/display.py`; its flags are the options model's (`cli/flags.py`)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from imagebatch.cli import display
from imagebatch.run.exit_codes import EXIT_INCOMPLETE, EXIT_USAGE, exit_code_for
from imagebatch.storage import layout
from imagebatch.storage.bounded import RecordError, read_record
from imagebatch.storage.location import redact_urls, shown_url

if TYPE_CHECKING:  # the flow modules import Prefect, which the command loads only once it is needed
    from imagebatch.options import RunOptions
    from imagebatch.platform.prefect_server import TemporaryServer
    from imagebatch.run.api_guard import PrefectGuard
    from imagebatch.run.hooks import RunHooks
    from imagebatch.run.preflight import Preflight


def _quiet_prefect() -> None:
    """Keep the terminal for the progress bar: Prefect's per-task chatter goes to its UI, not here.
    Prefect sets its loggers' levels from its logging config when `prefect.main` is first imported, and
    from settings it may have read already: the levels are set after that import, whichever came first."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    import prefect.main  # noqa: F401 - the run imports it next; its logging set-up must come first

    for name in ("prefect.task_runs", "prefect.flow_runs", "prefect", "httpx", "uvicorn"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _silence_prefect() -> None:
    """Prefect's server is lost: its loggers' complaints (a traceback for the flow run's final state, one
    error per event it cannot send) would bury the summary, which says it in one line."""
    names = [n for n in logging.root.manager.loggerDict if n == "prefect" or n.startswith("prefect.")]
    for name in ["prefect", *names]:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


ENDING_GRACE = 5.0
"""How long Prefect's engine may take to record a run's end once the records are written and Prefect's
server is lost, before the command prints the summary and exits without it."""


class Ending:
    """How the command ends when Prefect would hold it after the run's records are written:
    a signal then, or Prefect's server lost then for `ENDING_GRACE` seconds, prints the summary from the
    records and exits at once; a second signal abandons the run and marks run.json so."""

    def __init__(
        self, out: Console, err: Console, server: TemporaryServer | None, guard: PrefectGuard
    ) -> None:
        self.out, self.err, self.server, self.guard = out, err, server, guard
        self.signals: list[int] = []
        self._once = threading.Lock()

    @contextlib.contextmanager
    def watching(self, signals: list[int]) -> Iterator[None]:
        """While the flow runs: end without Prefect once it is lost after the records are written."""
        self.signals = signals
        done = threading.Event()

        def watch() -> None:
            self.guard.lost.wait()
            self.guard.written.wait()
            if not done.wait(ENDING_GRACE):
                self.now()

        threading.Thread(target=watch, name="imagebatch-ending", daemon=True).start()
        try:
            yield
        finally:
            done.set()

    def finish(self, info: dict[str, Any], signals: list[int]) -> int:
        """The run's end: Prefect's last logs sent while its temporary server is up, then the summary,
        the last thing printed (left to Prefect's exit handlers, the logs would go to a stopped server
        after the summary: `--- Error logging to API ---`, and up to 70 s of retries)."""
        if self.server is not None and not self.guard.lost.is_set():
            from imagebatch.platform.prefect_server import end_shipping

            end_shipping()
        code = display.report(self.out, self.err, info, signals, self.guard)
        self.guard.finish()
        if self.guard.lost.is_set():  # Prefect's exit handlers would send its queued events for minutes
            self.exit(code)
        return code

    def now(self) -> None:
        """Print the summary from the written records and exit (from any thread; once)."""
        if self.guard.result is None or not self._once.acquire(blocking=False):
            return
        if not self.guard.lost.is_set():
            self.guard.lose("the run was stopped while Prefect recorded its end")
        self.guard.finish()
        self.exit(display.report(self.out, self.err, self.guard.result, self.signals, self.guard))

    def exit(self, code: int) -> None:
        """Exit now, past Prefect's exit handlers (they would wait for a lost server)."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if self.server is not None:
            self.server.kill()
        os._exit(code)

    def abandoned(self, run_json: Path, reason: str) -> None:
        """Mark a run abandoned in its run.json (still "running": the run never wrote its end)."""
        from imagebatch.work.runsummary import RunSummary
        from imagebatch.work.store import write_atomic

        with contextlib.suppress(OSError, ValueError):  # a run.json the model refuses is left as it is
            info = RunSummary.parse(read_record(run_json) or b"", str(run_json))  # never waits on a FIFO
            if info.state == "running":
                ended = info.changed(
                    state="abandoned", ended_at=datetime.now(UTC).isoformat(), stopped=reason
                )
                write_atomic(run_json, ended.record())


@contextlib.contextmanager
def interrupts(
    hooks: RunHooks,
    err: Console,
    server: TemporaryServer | None,
    ending: Ending | None = None,
    run_json: Path | None = None,
) -> Iterator[list[int]]:
    """First Ctrl-C or SIGTERM: stop gracefully (no new request; those in flight finish and are saved);
    once the records are written, exit at once (what is left is Prefect's bookkeeping). Second: abandon
    what is in flight (the journal already marks it sent, so it will be `unknown`), mark run.json
    "abandoned", and exit. Yields the list of signals received (the exit code follows the first).

    The handler is also given to the flow (`hooks.signals`), which installs it again around dispatch:
    Prefect's flow engine replaces SIGTERM's handler with its own, which would crash the run."""
    from imagebatch.run.graceful_stop import Stopper, handling

    stopper: Stopper

    def announce(name: str) -> None:
        if ending is not None:
            ending.now()  # only once the records are written
        err.print(
            f"\nStopping ({name}): no new requests; waiting for those in flight to finish and be saved. "
            f"{name} again to abandon them (they would be 'unknown').",
            markup=False,
        )

    def abandon(_reason: str, first: int) -> None:
        err.print("Abandoned the requests in flight: a rerun reports them as 'unknown'.", markup=False)
        if ending is not None and run_json is not None:
            names = " ({}, then {})".format(*(stopper.name(s) for s in stopper.received[:2]))
            ending.abandoned(run_json, f"abandoned{names}: requests in flight are unknown")
        if server is not None:
            # SIGKILL, not SIGTERM: a terminated server prints tracebacks for the writes it was
            # making; SQLite rolls an interrupted write back either way.
            server.kill()
        os._exit(exit_code_for(first))

    stopper = Stopper(hooks.control, None, abandon, names=SIGNAL_NAMES, announce=announce)
    hooks.signals = lambda: handling(stopper)
    with handling(stopper):
        yield stopper.received


def _warm_imports(*, emulator: bool, report: bool) -> None:
    """Import now what the flow imports once it starts, while the temporary server is still starting (it
    takes about 3 s, this process is idle until then): Prefect's flow engine, FastAPI's encoder (Prefect
    serialises the flow's parameters with it), the embedded emulator's web stack and the thumbnails'
    drawing. About 0.5 s off a run's start on the temporary server (bench/README.md "Fixed start")."""
    import importlib

    names = ["prefect.flow_engine", "prefect.task_engine", "fastapi.encoders"]
    if emulator:
        names += ["imagebatch.emulator.app", "imagebatch.emulator.server", "uvicorn.server"]
    if report or emulator:
        names += ["PIL.ImageDraw", "PIL.ImageFont"]
    for name in names:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _temporary_server_settings(api_url: str) -> dict[Any, Any]:
    """Prefect's settings for a run on its temporary server: its address, and no flow-run heartbeats.

    Heartbeats let a long-lived server's automations notice a flow run whose process died; the temporary
    server dies with the run, so nothing could ever read them. Off, the end of the run does not wait
    for the heartbeat thread's current one-second sleep (0 to 1 s, Prefect's `_send_heartbeats`). Against
    a running server (`PREFECT_API_URL`) Prefect's own setting is left as it is."""
    from prefect.settings import PREFECT_API_URL

    return {PREFECT_API_URL: api_url, "flows.heartbeat_frequency": None}


def run_main(args: argparse.Namespace) -> int:
    """`imagebatch run`: every check first (exit 2 before anything is sent), then the flow.

    Without a configured Prefect API, Prefect's temporary server is started first of all, so that it
    starts while this process imports Prefect and checks the manifest (see `prefect_server`)."""
    from imagebatch.platform.prefect_server import TemporaryServer, prefect_api_configured

    server = None if prefect_api_configured() else TemporaryServer().start()
    try:
        return _run(args, server)
    except RecordError as exc:  # the replay (before Prefect or in the flow) met a record it refuses
        print(redact_urls(str(exc)), file=sys.stderr)
        return EXIT_USAGE
    finally:
        if server is not None:
            server.stop()


def _run(args: argparse.Namespace, server: TemporaryServer | None) -> int:
    from imagebatch.errors import UsageError

    err = Console(stderr=True, soft_wrap=True)
    out = Console(soft_wrap=True)
    if (found := _preflight(args, err)) is None:
        return EXIT_USAGE
    checked, options = found
    if server is not None and (info := _settled(checked, options)) is not None:
        server.kill()  # it was started while we checked; nothing will use it
        err.print("Nothing to send: every request is done or left alone; Prefect was not started.")
        return display.report(out, err, info, [])

    _quiet_prefect()
    from prefect.settings import temporary_settings

    from imagebatch.run.api_guard import PrefectGuard, guarding
    from imagebatch.run.hooks import RunHooks, run_hooks

    if not checked.base_url:
        err.print(
            "No service address configured: using the embedded emulator on 127.0.0.1 "
            "(its images are placeholders).",
            markup=False,
        )
    progress, on_progress = display.progress_bar(err)
    hooks = RunHooks(on_progress=on_progress, checked=checked)
    server = _prefect_server(server, emulator=not checked.base_url, report=options.outcome.report)
    try:
        api = (
            temporary_settings(_temporary_server_settings(server.wait_ready()))
            if server
            else contextlib.nullcontext()
        )
    except RuntimeError as exc:
        err.print(
            f"{exc}; nothing was sent. Set PREFECT_API_URL to use a running Prefect server.", markup=False
        )
        return EXIT_INCOMPLETE
    guard = PrefectGuard()
    guard.on_lost.append(_silence_prefect)
    ending = Ending(out, err, server, guard)
    try:
        with (
            api,
            interrupts(hooks, err, server, ending, _run_json(checked)) as signals,
            progress,
            run_hooks(hooks),
            guarding(guard),
            ending.watching(signals),
            _refusal_printed_once(),
        ):
            info = _generate(args, options, guard)
    except UsageError as exc:
        return _refused(err, exc, server)
    return ending.finish(info, signals)


def _refused(err: Console, exc: Exception, server: TemporaryServer | None) -> int:
    """The flow refused to start (`_refusal_printed_once`): one line; Prefect's log of the refusal sent
    before its temporary server stops (left to Prefect's exit handlers: `--- Error logging to API ---`)."""
    err.print(f"{redact_urls(str(exc))}; nothing was sent.", markup=False)
    if server is not None:
        from imagebatch.platform.prefect_server import end_shipping

        end_shipping()
    return EXIT_USAGE


class _NotUsageErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from imagebatch.errors import UsageError

        return not (record.exc_info and isinstance(record.exc_info[1], UsageError))


@contextlib.contextmanager
def _refusal_printed_once() -> Iterator[None]:
    """A run the flow refuses once it has started (another run took the folder after our own check):
    Prefect's engine logs the refusal with its traceback ("Encountered exception during execution"); its
    console handlers skip that record, the command prints the refusal in one line, and Prefect's log (its
    UI) keeps it."""
    from prefect.logging.handlers import PrefectConsoleHandler

    names = ["", *(n for n in logging.root.manager.loggerDict if n.startswith("prefect"))]
    found = {h for n in names for h in logging.getLogger(n).handlers if isinstance(h, PrefectConsoleHandler)}
    refusals = _NotUsageErrors()
    for handler in found:
        handler.addFilter(refusals)
    try:
        yield
    finally:
        for handler in found:
            handler.removeFilter(refusals)


def _generate(args: argparse.Namespace, options: RunOptions, guard: PrefectGuard) -> dict[str, Any]:
    """Run the flow; its summary. Once the run's records are written, a failure of Prefect's engine to
    record the run's end (its server lost) does not make the run fail: the records are the run's."""
    from imagebatch.flows.batch import generate_from_manifest
    from imagebatch.run.final_state import summary_of

    try:
        state: Any = generate_from_manifest(
            manifest=str(args.manifest), out=str(args.out), options=options, return_state=True
        )
        return summary_of(state)  # raises what the flow raised
    except Exception as exc:
        if guard.result is None:
            _raise_if_unreachable(exc)
            raise
        guard.lose(f"its flow engine could not record the run's end: {exc!r}")
        return guard.result


def _raise_if_unreachable(exc: Exception) -> None:
    """A Prefect server that `PREFECT_API_URL` names (the environment, a profile) but that does not answer:
    Prefect's engine raises "Failed to reach API" as it starts the flow run, before anything is sent. That
    is the run's configuration, said in one line (exit 2) rather than as Prefect's three tracebacks."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    from imagebatch.errors import UsageError

    if isinstance(exc, RuntimeError) and isinstance(exc.__cause__, httpx.TransportError):
        raise UsageError(
            f"Prefect's API at {PREFECT_API_URL.value()} (PREFECT_API_URL) does not answer "
            f"({exc.__cause__}): start that server, or unset PREFECT_API_URL to run on a temporary one"
        ) from None


def _run_json(checked: Preflight) -> Path | None:
    """The run.json a second signal marks abandoned: a local folder's (a bucket's run is marked by the
    next run, which finds its lease expired)."""
    return checked.out / layout.RUN_JSON if isinstance(checked.out, Path) else None


def _settled(checked: Preflight, options: RunOptions) -> dict[str, Any] | None:
    """The run's summary when it has nothing to send, its records written without Prefect
    (`run.nothing_to_send`); else None."""
    from imagebatch.run.nothing_to_send import settle_without_prefect

    return settle_without_prefect(checked, options)


def _preflight(args: argparse.Namespace, err: Console) -> tuple[Preflight, RunOptions] | None:
    """Everything that can be checked without Prefect, checked first (a mistake costs no start-up): the
    run's checks and its options (`cli.flags.options_from`); None, the problems printed, when the
    run cannot start."""
    from imagebatch.cli.flags import options_from
    from imagebatch.errors import UsageError
    from imagebatch.manifest import ManifestError
    from imagebatch.run.preflight import preflight
    from imagebatch.run.verdict import parse_allowance

    try:
        options = options_from(args, "run")
        parse_allowance(options.outcome.allow_failures)
        return preflight(args.manifest, args.out, options), options
    except ManifestError as exc:
        for problem in exc.problems:
            err.print(str(problem), markup=False, highlight=False)
        where, n = shown_url(args.manifest), len(exc.problems)
        err.print(
            f"{where}: {n} problem{'s' if n != 1 else ''}; nothing was sent.",
            markup=False,
        )
        return None
    except UsageError as exc:
        err.print(f"{redact_urls(str(exc))}; nothing was sent.", markup=False)
        return None


def _prefect_server(
    server: TemporaryServer | None, *, emulator: bool, report: bool
) -> TemporaryServer | None:
    """The temporary server to run on, or None when Prefect's settings name a running one."""
    from prefect.settings import PREFECT_API_URL

    from imagebatch.platform.prefect_server import TemporaryServer

    if PREFECT_API_URL.value():
        if server is not None:  # configured in a way the quick look missed: Prefect's own settings win
            server.stop()
            server = None
    elif server is None:
        server = TemporaryServer().start()
    if server is not None:
        _warm_imports(emulator=emulator, report=report)
    return server
