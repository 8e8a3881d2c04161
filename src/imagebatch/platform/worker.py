"""`imagebatch worker`: Prefect's process worker, stopped so that its flow runs stop gracefully first.

    imagebatch worker --pool POOL [--limit N] [--grace S] [-- more `prefect worker start` options]

Why: on SIGTERM, `prefect worker start` (Prefect 3.8.8) turns the signal into its own SIGINT and shuts
down by cancelling its task group; cancelling the `anyio` process of each flow run closes its transport,
which SIGKILLs the flow process at once (`anyio._backends._asyncio.Process.aclose`). Nothing in the flow
can catch that: the run vanishes mid-request, run.json stays "running", no results.csv, and the flow run
stays Running in Prefect. (A cancellation from the UI is different: the worker sends SIGTERM and waits
30 s, which the flow handles itself: `run.graceful_stop`.)

So this command runs `prefect worker start` as its child (in a session of its own, so that a terminal's
Ctrl-C reaches this process only) and, on the first SIGTERM or SIGINT, first sends SIGTERM to each of the
worker's flow-run processes (each leads a process group of its own), which stop as on a terminal (what
is in flight finishes and is saved, results.csv and run.json "stopped", the run Cancelled), waits until
they have ended (at most `grace` seconds: the flow itself abandons what is still in flight after
`run.constants.STOP_GRACE`),
and only then stops the worker. A second signal stops the worker at once (Prefect's own behaviour).

The worker is given `STOP_BOUND` seconds to exit after its SIGTERM, then its process group is killed:
with no flow run left there is nothing of the worker's own to save, and Prefect 3.8.8's worker, once
stopped, waits without bound at exit for its server (its `atexit` shutdown of Prefect's loop thread, which
is still sending the worker's last events): a server that stalls (SQLite busy under several workers, up to
60 s a request, Prefect #23051) kept it in `epoll_wait` for minutes. The flow runs lead process groups of
their own, so the kill never reaches one. A signal that arrives while the worker is being started is kept
and acted on once it has been.

The flow-run processes are found as the worker's children whose environment names a flow run
(`PREFECT__FLOW_RUN_ID`), through /proc (Linux; elsewhere the worker is stopped directly). During the
drain the worker still polls: a run it picks up then is stopped the Prefect way when it stops.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebatch.run.constants import WORKER_GRACE
from imagebatch.words import counted

GRACE = WORKER_GRACE
"""Seconds to wait for the flow runs to end after their SIGTERM (`run.constants.WORKER_GRACE`)."""

STOP_BOUND = 10.0
"""Seconds the stopped worker gets to exit before its process group is killed (it stops in about a second
when its server answers)."""


@dataclass(frozen=True)
class WorkerEnd:
    """How the worker ended: its exit status (negative: killed by that signal) and the first stop signal
    this process received, if any."""

    returncode: int
    received: int | None = None


def run_worker(pool: str, limit: int | None, grace: float, extra: Sequence[str] = ()) -> WorkerEnd:
    """Run `prefect worker start` for `pool` (`limit` flow runs at once, `extra` more options of its own)
    until it exits; a SIGTERM or SIGINT here drains its flow runs first (`Drain`, `grace` seconds)."""
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"]
    command += ["--limit", str(limit)] if limit is not None else []
    early: list[int] = []
    previous = {sig: signal.signal(sig, _keep(early)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        worker = subprocess.Popen([*command, *extra], start_new_session=True)
        drain = Drain(worker, grace)
        for sig in previous:
            signal.signal(sig, drain.on_signal)
        for signum in early:  # received while the worker was being started
            drain.on_signal(signum)
        while (code := worker.poll()) is None:
            drain.step()
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return WorkerEnd(code, drain.received[0] if drain.received else None)


def _keep(received: list[int]) -> Callable[[int, Any], None]:
    def keep(signum: int, _frame: Any = None) -> None:
        received.append(signum)

    return keep


class Drain:
    """The stop sequence: SIGTERM the flow runs, wait for them (bounded), then stop the worker, and kill
    its process group if it has not exited `stop_bound` seconds later."""

    def __init__(
        self,
        worker: subprocess.Popen[bytes],
        grace: float,
        clock: Callable[[], float] = time.monotonic,
        flow_runs: Callable[[int], list[int]] | None = None,
        kill: Callable[[int, int], None] = os.killpg,
        alive: Callable[[int], bool] | None = None,
        stop_bound: float = STOP_BOUND,
    ) -> None:
        self.worker, self.grace, self.clock, self.stop_bound = worker, grace, clock, stop_bound
        self.flow_runs = flow_runs or flow_run_processes
        self.kill = kill
        self.alive = alive or _alive
        self.received: list[int] = []
        self.deadline: float | None = None
        self.draining: list[int] = []
        self.worker_stopped = False
        self.kill_at: float | None = None

    def on_signal(self, signum: int, _frame: Any = None) -> None:
        self.received.append(signum)
        if len(self.received) == 1:
            self.draining = self.flow_runs(self.worker.pid)
            for pid in self.draining:
                self._send(pid, signal.SIGTERM)
            self.deadline = self.clock() + self.grace
            print(
                f"imagebatch worker: stopping {counted(len(self.draining), 'flow run')} gracefully (up to "
                f"{self.grace:g} s), then the worker",
                file=sys.stderr,
                flush=True,
            )
        else:
            self._stop_worker()

    def step(self) -> None:
        """Called every 0.2 s while the worker runs: stop it once the drained runs have ended or the grace
        ran out; kill it once it has had `stop_bound` seconds to exit."""
        if self.kill_at is not None and self.clock() >= self.kill_at:
            self.kill_at = None
            print(
                f"imagebatch worker: the worker had not exited {self.stop_bound:g} s after its stop "
                "(its Prefect server does not answer?): killed",
                file=sys.stderr,
                flush=True,
            )
            self._send(self.worker.pid, signal.SIGKILL)
        if self.deadline is None or self.worker_stopped:
            return
        self.draining = [pid for pid in self.draining if self.alive(pid)]
        if not self.draining or self.clock() >= self.deadline:
            self._stop_worker()

    def _stop_worker(self) -> None:
        if not self.worker_stopped:
            self.kill_at = self.clock() + self.stop_bound
        self.worker_stopped = True
        self._send(self.worker.pid, signal.SIGTERM)

    def _send(self, group: int, signum: int) -> None:
        try:
            self.kill(group, signum)
        except (ProcessLookupError, PermissionError):
            pass


def flow_run_processes(worker_pid: int) -> list[int]:
    """The worker's children that run a flow (their environment names one); each leads its own group."""
    found = []
    for proc in Path("/proc").iterdir() if Path("/proc/self").exists() else []:
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != worker_pid:
                continue
            if b"PREFECT__FLOW_RUN_ID=" in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A child of the worker that has exited stays a zombie until the worker reaps it.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
