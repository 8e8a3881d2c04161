"""A run's injected dependencies (`RunHooks`): how the command line and the tests reach into a flow run
started in the same process (a recording sleep, a clock, a transport, the progress callback, Ctrl-C)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import httpx

from imagebatch.run.constants import NEVER_STARTED, SHARD_GRACE
from imagebatch.run.dispatch import ProgressSnapshot, RunControl
from imagebatch.run.preflight import Preflight


@dataclass
class RunHooks:
    """Injected dependencies of a run: tests pass a recording sleep, the CLI a progress callback."""

    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    """The clock `--rpm`'s pacing reads (tests advance a fake one in `sleep`)."""
    transport: httpx.BaseTransport | None = None
    on_progress: Callable[[ProgressSnapshot], None] | None = None
    """Called from the flow's thread after each dispatch step and each finished unit."""
    emulator_settings: dict[str, Any] = field(default_factory=dict)
    """Extra settings for the embedded emulator (tests: faults, latency)."""
    control: RunControl = field(default_factory=RunControl)
    """Stops the run gracefully from outside (the CLI's Ctrl-C)."""
    checked: Preflight | None = None
    """The command's own preflight of the same run, so the flow does not load the manifest again."""
    shard_grace: float = SHARD_GRACE
    """How long a Running shard's lock may be free before its run counts as crashed (`run.shard_runs`)."""
    shard_never_started: float = NEVER_STARTED
    """How long a shard a worker claimed may take to start (`run.shard_runs`); once Prefect's server is
    lost, how long the lock of a shard never seen running must stay free before it counts as ended."""
    signals: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    """The command's Ctrl-C/SIGTERM handling, installed again around dispatch (Prefect's flow engine
    installs its own SIGTERM handler, which crashes the run instead of stopping it)."""


_hooks: ContextVar[RunHooks | None] = ContextVar("imagebatch_run_hooks", default=None)


def current_hooks() -> RunHooks | None:
    """The hooks `run_hooks` set for this thread's flows, if any."""
    return _hooks.get()


@contextlib.contextmanager
def run_hooks(hooks: RunHooks) -> Iterator[RunHooks]:
    """Use `hooks` for the flows run inside this block (in this thread)."""
    token = _hooks.set(hooks)
    try:
        yield hooks
    finally:
        _hooks.reset(token)
