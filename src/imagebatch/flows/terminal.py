"""`imagebatch run` on a terminal: the checks before Prefect starts, the progress bar, Ctrl-C and SIGTERM,
the summary and the exit code. The command line itself (every option) is in `cli.py`."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from imagebatch.flows.exits import EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE, exit_code_for
from imagebatch.tasks.layout import UNKNOWN_HINT
from imagebatch.tasks.prices import money

if TYPE_CHECKING:  # the flow modules import Prefect, which the command loads only once it is needed
    from imagebatch.flows.batch import RunHooks
    from imagebatch.flows.config import Preflight
    from imagebatch.flows.dispatch import ProgressSnapshot
    from imagebatch.flows.prefect_server import TemporaryServer


def _quiet_prefect() -> None:
    """Keep the terminal for the progress bar: Prefect's per-task chatter goes to its UI, not here."""
    for name in ("prefect.task_runs", "prefect.flow_runs", "prefect", "httpx", "uvicorn"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


@contextlib.contextmanager
def interrupts(hooks: RunHooks, err: Console, server: TemporaryServer | None) -> Iterator[list[int]]:
    """First Ctrl-C or SIGTERM: stop gracefully (no new request; those in flight finish and are saved).
    Second: abandon what is in flight (the journal already marks it sent, so it will be `unknown`) and
    exit. Yields the list of signals received (the exit code follows the first).

    The handler is also given to the flow (`hooks.signals`), which installs it again around dispatch:
    Prefect's flow engine replaces SIGTERM's handler with its own, which would crash the run."""
    received: list[int] = []
    control = hooks.control

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signum)
        name = SIGNAL_NAMES[signal.Signals(signum)]
        if len(received) == 1:
            control.stop(f"interrupted ({name})")
            err.print(
                f"\nStopping ({name}): no new requests; waiting for those in flight to finish and be saved. "
                f"{name} again to abandon them (they would be 'unknown').",
                markup=False,
            )
            return
        err.print("Abandoned the requests in flight: a rerun reports them as 'unknown'.", markup=False)
        if server is not None:
            # SIGKILL, not SIGTERM: a terminated server prints tracebacks for the writes it was
            # making; SQLite rolls an interrupted write back either way.
            server.kill()
        os._exit(exit_code_for(received[0]))

    hooks.signals = lambda: handling(on_signal)
    with handling(on_signal):
        yield received


@contextlib.contextmanager
def handling(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Handle Ctrl-C and SIGTERM with `handler` inside this block (main thread only), then restore."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in SIGNAL_NAMES}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def _warm_imports(*, emulator: bool, report: bool) -> None:
    """Import now what the flow imports once it starts, while the temporary server is still starting (it
    takes about 3 s, this process is idle until then): Prefect's flow engine, FastAPI's encoder (Prefect
    serialises the flow's parameters with it), the embedded emulator's web stack and the thumbnails'
    drawing. About 0.5 s off a run's start on the temporary server (bench/README.md "Fixed start")."""
    import importlib

    names = ["prefect.flow_engine", "prefect.task_engine", "fastapi.encoders"]
    if emulator:
        names += ["imagebatch.gateway.emulator.app", "imagebatch.gateway.emulator.server", "uvicorn.server"]
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
    from imagebatch.flows.prefect_server import TemporaryServer, prefect_api_configured

    server = None if prefect_api_configured() else TemporaryServer().start()
    try:
        return _run(args, server)
    finally:
        if server is not None:
            server.stop()


def _run(args: argparse.Namespace, server: TemporaryServer | None) -> int:
    from imagebatch.flows.config import UsageError

    err = Console(stderr=True, soft_wrap=True)
    out = Console(soft_wrap=True)
    checked = _preflight(args, err)
    if checked is None:
        return EXIT_USAGE

    _quiet_prefect()
    from prefect.settings import temporary_settings

    from imagebatch.flows.batch import RunHooks, generate_from_manifest, run_hooks

    if not checked.base_url:
        err.print(
            "No service address configured: using the embedded emulator on 127.0.0.1 "
            "(its images are placeholders).",
            markup=False,
        )
    progress, on_progress = _progress_bar(err)
    hooks = RunHooks(on_progress=on_progress, checked=checked)
    server = _prefect_server(server, emulator=not checked.base_url, report=args.report)
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
    try:
        with api, interrupts(hooks, err, server) as signals, progress, run_hooks(hooks):
            info = generate_from_manifest(
                manifest=str(args.manifest),
                out=str(args.out),
                concurrency=args.concurrency,
                base_url=args.base_url,
                force=args.force,
                retry_unknown=args.retry_unknown,
                api_key_secret_block=args.api_key_block,
                rpm=args.rpm,
                adaptive=args.adaptive,
                max_images=args.max_images,
                max_spend=args.max_spend,
                prices=args.prices,
                global_limit=args.global_limit,
                report=args.report,
                files_root=args.files_root,
            )
    except UsageError as exc:
        err.print(f"{exc}; nothing was sent.", markup=False)
        return EXIT_USAGE
    return _report(out, err, info, signals)


def _preflight(args: argparse.Namespace, err: Console) -> Preflight | None:
    """Everything that can be checked without Prefect, checked first (a mistake costs no start-up); None,
    the problems printed, when the run cannot start."""
    from imagebatch.flows.config import UsageError, preflight
    from imagebatch.manifest import ManifestError

    try:
        return preflight(
            args.manifest,
            args.out,
            concurrency=args.concurrency,
            base_url=args.base_url,
            api_key_secret_block=args.api_key_block,
            rpm=args.rpm,
            max_images=args.max_images,
            max_spend=args.max_spend,
            prices=args.prices,
            files_root=args.files_root,
        )
    except ManifestError as exc:
        for problem in exc.problems:
            err.print(str(problem), markup=False, highlight=False)
        err.print(f"{args.manifest}: {len(exc.problems)} problem(s); nothing was sent.", markup=False)
        return None
    except UsageError as exc:
        err.print(f"{exc}; nothing was sent.", markup=False)
        return None


def _prefect_server(
    server: TemporaryServer | None, *, emulator: bool, report: bool
) -> TemporaryServer | None:
    """The temporary server to run on, or None when Prefect's settings name a running one."""
    from prefect.settings import PREFECT_API_URL

    from imagebatch.flows.prefect_server import TemporaryServer

    if PREFECT_API_URL.value():
        if server is not None:  # configured in a way the quick look missed: Prefect's own settings win
            server.stop()
            server = None
    elif server is None:
        server = TemporaryServer().start()
    if server is not None:
        _warm_imports(emulator=emulator, report=report)
    return server


def _report(out: Console, err: Console, info: dict[str, Any], signals: list[int]) -> int:
    """Print the run's summary, usage, spend and warnings; return the exit code."""
    _print_summary(out, info)
    _print_usage(out, info.get("usage", []))
    if info.get("spend"):
        s = info["spend"]
        line = f"estimated spend this run: {money(s['spent'], s['currency'])}"
        if s["in_doubt"]:
            line += f" (up to {money(s['spent'] + s['in_doubt'])} if the unknown requests were billed)"
        if s["unpriced"]:
            line += f"; no price for {', '.join(s['unpriced'])} (counted as 0)"
        out.print(line, markup=False, highlight=False)
    if info.get("report"):
        out.print(f"report: {info['report']}", markup=False, highlight=False)
    if info.get("stopped"):
        err.print(f"Stopped early: {info['stopped']}. A rerun picks up where this one stopped.", markup=False)
    counts: dict[str, int] = info["counts"]
    if counts.get("unknown"):
        err.print(
            f"{counts['unknown']} request(s) have an unknown outcome (sent, no answer); "
            f"for each, {UNKNOWN_HINT}.",
            markup=False,
        )
    if info.get("rate_limited"):
        err.print(
            f"{info['rate_limited']} request(s) failed on HTTP 429 (the service's rate limit; the native and "
            "chat routes are never retried): a rerun sends them; a lower --rpm or --concurrency avoids it.",
            markup=False,
        )
    for line in info.get("unwritten", []):
        err.print(line, markup=False)
    if signals:
        return exit_code_for(signals[0])
    incomplete = sum(v for k, v in counts.items() if k not in ("succeeded", "skipped"))
    return EXIT_INCOMPLETE if incomplete or info.get("unwritten") else EXIT_OK


def _progress_bar(err: Console) -> tuple[Progress, Callable[[ProgressSnapshot], None]]:
    """A progress bar on a terminal (nothing elsewhere) and the callback that moves it."""
    progress = Progress(
        TextColumn("[bold]imagebatch"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not err.is_terminal,
    )
    bar = progress.add_task("run", total=None, stats="starting Prefect")
    t0: list[float] = []  # the rate counts from the first dispatch, not from Prefect's start-up

    def on_progress(snap: ProgressSnapshot) -> None:
        if not t0:
            t0.append(time.monotonic())
        minutes = max(time.monotonic() - t0[0], 1e-6) / 60
        failed = sum(snap.counts.get(s, 0) for s in ("failed", "unknown", "no_image"))
        done = sum(snap.counts.get(s, 0) for s in ("succeeded", "skipped"))
        left = snap.counts.get("not_attempted", 0)
        rate = snap.images / minutes
        stats = f"done {done}  failed {failed}  in flight {snap.in_flight}  {rate:.1f} img/min"
        stats += f"  not attempted {left}" if left else ""
        stats += f"  window {snap.window}  429s {snap.rate_limited}" if snap.rate_limited else ""
        progress.update(bar, total=snap.planned, completed=snap.done, stats=stats)

    return progress, on_progress


def _print_usage(console: Console, usage: list[dict[str, Any]]) -> None:
    """The usage summary (every run into the folder), as written to usage-summary.csv."""
    if not usage:
        return
    table = Table(title="usage (all runs into this folder)")
    names = ("route", "model", "requests", "attempts", "images", "unknown", "total_tokens", "latency_p50_s")
    heads = ("route", "model", "requests", "attempts", "images", "unknown", "tokens", "p50 s")
    for name, head in zip(names, heads, strict=True):
        table.add_column(head, justify="left" if name in ("route", "model") else "right", overflow="fold")
    for row in usage:
        table.add_row(*("" if row[n] is None else f"{row[n]:.2f}" if n == "latency_p50_s" else str(row[n])
                        for n in names))  # fmt: skip
    console.print(table)


def _print_summary(console: Console, info: dict[str, Any]) -> None:
    console.print(f"imagebatch: {info['requests']} request(s) -> {info['out']}", markup=False)
    table = Table()
    table.add_column("status")
    table.add_column("requests", justify="right")
    for status, n in info["counts"].items():
        if n:
            table.add_row(status, str(n))
    console.print(table)
