"""A graceful stop where no terminal started the run: under a Prefect worker, `imagebatch serve`, or a
Python caller of the flow. The rule itself is `Stopper`'s, also on a terminal, where
`cli.terminal.interrupts` gives it the terminal's effects and its handler wins.

What Prefect 3.8 sends the flow's process (read in prefect/runner and prefect/utilities):

- **A worker's own SIGTERM** (`docker stop`, a node drain, a deploy): `prefect worker start` turns it into
  a SIGINT to itself (`processutils.setup_signal_handlers_worker`); the worker shuts down, and its process
  manager sends SIGTERM to each flow run's process group (`runner._process_manager.ProcessManager.kill`;
  the flow runs in a group of its own under a supervisor that ignores SIGTERM). The worker then exits
  without waiting, so the flow process is on its own: its output pipe has no reader any more.
- **A cancellation in the UI** (the flow run set to CANCELLING): the worker's observer sees it and
  `runner._cancellation_manager.CancellationManager.cancel` offers a "cancel" intent on its control
  channel (acknowledged only while Prefect's own SIGTERM handler is installed), then sends SIGTERM to the
  process group, waits up to **30 s** for it to exit, then SIGKILLs it; then it forces the run to
  Cancelled ("Flow run was cancelled successfully.").

Prefect's flow engine handles SIGTERM by raising `TerminationSignal` in the main thread, which ends the
run at once as Crashed (or Cancelled) with nothing recorded. So around dispatch the flow installs the
same handling as the command (`graceful_stop`): the first SIGTERM (or SIGINT) stops the run the way
Ctrl-C does (no new request; those in flight finish and are saved; results.csv and run.json written
"stopped"; the flow run ends **Cancelled** with the counts, see `run.final_state`). Requests in flight
that have not finished `grace` seconds (`run.constants.STOP_GRACE`, inside Prefect's 30) after the first
signal, or at a second signal, are abandoned: the run is set Crashed with that reason and the process
exits (143): the journal
already has them as sent, so a rerun reports them `unknown` and sends the rest.

A worker that died leaves the flow's stdout and stderr pipes without a reader: Prefect's console log
handler writes through rich, which answers a broken pipe with `SystemExit` and so crashed the run.
`safe_output` makes every such write quietly go nowhere instead (`SafeStream`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from imagebatch.run.constants import INTERRUPTED, STOP_GRACE
from imagebatch.run.dispatch import RunControl
from imagebatch.run.exit_codes import exit_code_for

GRACE = STOP_GRACE
SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}

logger = logging.getLogger("imagebatch.run")


class Stopper:
    """The one rule of a stop, wherever the run was started: the first signal stops the run gracefully (no
    new request; those in flight finish and are saved) and, given a `grace`, arms a timer; the timer or a
    second signal abandons what is in flight (`abandon`: the journal has it as sent, so a rerun reports it
    `unknown`). How each is said and what abandoning does are the caller's: under a worker (`graceful_stop`)
    a log line and the flow run set Crashed; on a terminal (`cli.terminal.interrupts`) a printed line, the
    summary once the records are written, run.json marked abandoned (no timer: a person is watching)."""

    def __init__(
        self,
        control: RunControl,
        grace: float | None = GRACE,
        abandon: Callable[[str, int], None] | None = None,
        timer: Callable[[float, Callable[[], None]], Any] | None = None,
        log: logging.Logger | logging.LoggerAdapter[Any] = logger,
        *,
        names: dict[signal.Signals, str] = SIGNALS,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self.control = control
        self.log = log
        self.grace = grace
        self.abandon = abandon or abandon_run
        self.timer = timer or _start_timer
        self.names = names
        self.announce = announce or self._log_stopping
        self.received: list[int] = []
        self._pending: Any = None

    def name(self, signum: int) -> str:
        return self.names.get(signal.Signals(signum), f"signal {signum}")

    def __call__(self, signum: int, _frame: Any = None) -> None:
        self.received.append(signum)
        name = self.name(signum)
        if len(self.received) == 1:
            self.control.stop(f"{INTERRUPTED} ({name})")
            self.announce(name)
            if self.grace is not None:
                late = f"not finished {self.grace:g} s after {name}"
                self._pending = self.timer(self.grace, lambda: self._give_up(late))
            return
        self._give_up(f"a second {name}")

    def _log_stopping(self, name: str) -> None:
        # Logging takes locks: never from the handler itself, which may have interrupted a log call.
        threading.Thread(target=_log_stopping, args=(self.log, name, self.grace or 0), daemon=True).start()

    def _give_up(self, why: str) -> None:
        reason = f"requests in flight abandoned ({why}): a rerun reports them as 'unknown'"
        self.abandon(reason, self.received[0])

    def cancel(self) -> None:
        """The run ended before the grace ran out."""
        if self._pending is not None:
            self._pending.cancel()


@contextlib.contextmanager
def handling(
    handler: Callable[[int, Any], None], signals: Iterable[signal.Signals] = SIGNALS
) -> Iterator[None]:
    """Handle `signals` (SIGTERM and SIGINT) with `handler` inside this block, then restore the handlers
    that were there. Main thread only: elsewhere nothing is installed (Python delivers signals there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def _start_timer(seconds: float, action: Callable[[], None]) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.daemon = True
    timer.start()
    return timer


def _log_stopping(log: logging.Logger | logging.LoggerAdapter[Any], name: str, grace: float) -> None:
    log.warning(
        "Stopping (%s): no new requests; waiting up to %g s for those in flight to finish and be saved.",
        name,
        grace,
    )


def abandon_run(reason: str, signum: int) -> None:
    """Set this flow run Crashed with `reason` (bounded: 5 s) and leave at once with 128 + `signum`."""
    with contextlib.suppress(Exception):
        logger.error("Abandoned: %s", reason)
        from prefect.client.orchestration import get_client
        from prefect.runtime import flow_run
        from prefect.states import Crashed

        if flow_run.id:
            with get_client(sync_client=True, httpx_settings={"timeout": 5.0}) as client:
                client.set_flow_run_state(flow_run.id, Crashed(message=f"imagebatch: {reason}"), force=True)
    os._exit(exit_code_for(signum))


@contextlib.contextmanager
def graceful_stop(control: RunControl, grace: float = GRACE) -> Iterator[Stopper]:
    """Handle SIGTERM and SIGINT with a `Stopper` inside this block (`handling`), then restore."""
    stopper = Stopper(control, grace, log=_run_logger())
    try:
        with handling(stopper):
            yield stopper
    finally:
        stopper.cancel()


def _run_logger() -> logging.Logger | logging.LoggerAdapter[Any]:
    """The flow run's logger (its lines reach the run's log in Prefect from any thread), else ours."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return logger


class SafeStream(io.TextIOBase):
    """A text stream that writes through to `target` until a write or flush fails (a reader that died:
    EPIPE; a closed descriptor: EBADF), then drops everything, never raising."""

    def __init__(self, target: IO[str]) -> None:
        self.target: IO[str] | None = target

    def write(self, text: str) -> int:
        if self.target is not None:
            try:
                self.target.write(text)
            except (OSError, ValueError):
                self.target = None
        return len(text)

    def flush(self) -> None:
        if self.target is not None:
            try:
                self.target.flush()
            except (OSError, ValueError):
                self.target = None

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", None) or "utf-8"


@contextlib.contextmanager
def safe_output() -> Iterator[None]:
    """`sys.stdout`, `sys.stderr` and the streams of the logging handlers on Prefect's and the root
    logger (rich consoles included) become `SafeStream`s inside this block; all restored after."""
    import sys

    undo: list[Callable[[], None]] = []
    for name in ("stdout", "stderr"):
        original = getattr(sys, name)
        if _is_descriptor(original):
            setattr(sys, name, SafeStream(original))
            undo.append(lambda name=name, original=original: setattr(sys, name, original))  # type: ignore[misc]
    for handler in _stream_handlers():
        stream = handler.stream
        if not _is_descriptor(stream):
            continue
        handler.stream = SafeStream(stream)
        undo.append(lambda h=handler, s=stream: setattr(h, "stream", s))  # type: ignore[misc]
        console = getattr(handler, "console", None)
        if console is not None and hasattr(console, "file"):
            before = console._file  # rich's own: None means "sys.stdout or sys.stderr when writing"
            console.file = SafeStream(console.file)
            undo.append(lambda c=console, f=before: setattr(c, "file", f))  # type: ignore[misc]
    try:
        yield
    finally:
        for action in reversed(undo):
            action()


def _is_descriptor(stream: Any) -> bool:
    """A stream on a file descriptor (a pipe, a terminal, a file): not one of ours, nor an in-memory
    stream such as pytest's capture, which nothing can break and whose readers expect it as it is."""
    if stream is None or isinstance(stream, SafeStream):
        return False
    try:
        stream.fileno()
    except (OSError, ValueError, AttributeError):
        return False
    return True


def _stream_handlers() -> list[logging.StreamHandler[Any]]:
    names = [""] + [n for n in logging.root.manager.loggerDict if n.startswith(("prefect", "imagebatch"))]
    found: list[logging.StreamHandler[Any]] = []
    for name in names:
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and handler not in found:
                found.append(handler)
    return found
