"""The shards' flow runs on Prefect's server, as the parent of a sharded run watches them to their end
(the split and the parent's records: `run.shards`; the runs' creation: `run.shard_creation`).

The parent claims and runs some shards in child processes of its own (`_claim`, `run.shard_child`) and
reads each run's state until every one has ended (`run_shards`). Prefect is the run's bookkeeping, never
its critical path (`run.api_guard`): a call that fails (Prefect's client has retried it for about a
minute) is made again on the next turn, and once Prefect's server counts as lost, the parent stops asking
it and knows each shard's end from what it sees itself (`_Watch.turn_without_prefect`): its own shard's
process exiting or its lock freed, a worker's shard's lock (or a bucket's lease) free for the grace; the
run's records are written all the same.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from imagebatch.options import START_TIMEOUT
from imagebatch.run import shard_child
from imagebatch.run.constants import NEVER_STARTED, SHARD_GRACE, TERMINAL_STATES
from imagebatch.run.shard_creation import create_shard_runs
from imagebatch.run.shards import shard_name
from imagebatch.work.store import OutputStore


@dataclass
class _Shard:
    """One shard's flow run as the parent tracks it."""

    index: int
    run_id: Any
    created: float
    state: str | None = None
    message: str | None = None
    here: subprocess.Popen[bytes] | None = None
    """The process the parent started for it, when the parent claimed it (`_claim`)."""
    claimed_here: bool = False
    seen_held: bool = False
    """Its lock (an object store's lease) has been seen held: it has started sending."""
    told_to_stop: bool = False
    """The parent's stop has reached it (`_signal_ours`, `_stop_all`): it is never told twice."""
    pending_since: float | None = None
    unheld_since: float | None = None
    ended_at: float | None = None
    """When the parent first knew it had ended (read its run in a final state, or saw it end)."""

    def done(self, now: float) -> bool:
        """Its run is final and its process, if ours, has exited or has had `EXIT_WAIT` seconds to."""
        if self.state not in ENDED:
            return False
        return self.here is None or (self.ended_at is not None and now - self.ended_at >= EXIT_WAIT)


EXIT_WAIT = 10.0
"""Seconds a shard process of the parent's own may take to exit once its run is final (it holds no lock by
then: its records are written). Past them the parent goes on and stops it (`_end_ours`): a process that
reported its end to a server that no longer answers can wait a minute to send its last log lines, which
would take a stopping parent past its own grace."""


KILL_AFTER = 3.0
"""Seconds a shard process of ours that the parent stops as it leaves (`_end_ours`) gets after its SIGTERM."""


def run_shards(
    deployment: str,
    parameters: dict[int, dict[str, Any]],
    shards: int,
    store: OutputStore,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    poll: float = 2.0,
    grace: float = SHARD_GRACE,
    start_timeout: float = START_TIMEOUT,
    never_started: float = NEVER_STARTED,
    stopped: Callable[[], str | None] = lambda: None,
    lost: Callable[[], bool] = lambda: False,
    lose: Callable[[str], None] = lambda _why: None,
) -> list[dict[str, Any]]:
    """Start the shard runs of `deployment` (sub-runs of this one, a run per shard in `parameters`, from
    `shard_parameters`), run some here, wait until each ends. Returns, per shard started, its number, its
    flow run's id, final state (`UNKNOWN` when Prefect's server was lost before it was read) and message,
    and whether the parent ran it (`here`).

    The parent holds a worker's slot, so it never only waits there (a pool of concurrency 1, or one
    worker started with `--limit 1`, would deadlock): it claims the first at once, and any shard no worker
    has claimed within `start_timeout` seconds once its own is done, as a worker claims a run (proposing
    Pending: the server accepts one claim only) and runs it in a child process with Prefect's own flow
    engine (`run.shard_child`). One at a time: the parent's slot is one run's worth of its machine.

    A shard a worker claimed that is not Running `never_started` seconds later (its worker died between
    claim and start) is marked Crashed, and so is a Running one whose lock has been free for `grace`
    seconds (`SHARD_GRACE`; its machine died: the process held its shard lock while it sent). The run goes
    on without them: what they sent without an answer is `unknown`, what they never sent is sent by the
    next run. Once `stopped()` gives a reason (the parent's own stop), every shard stops (`_stop_all`).
    Once Prefect's server is lost (`_guarded`: the run's health checks lost it, `lost()`, and a call is
    refused; or every call has failed for `PATIENCE` seconds, when `lose(why)` tells the run's guard), the
    watch goes on without it (`_Watch.turn_without_prefect`)."""
    from prefect.client.orchestration import get_client

    made = create_shard_runs(deployment, parameters, shards, clock, sleep, stopped)
    tracked = [_Shard(i, run_id, clock()) for i, run_id in made.items()]
    with get_client(sync_client=True) as client:
        watch = _Watch(client, tracked, store, shards, clock, grace, start_timeout, never_started, stopped)
        failed = _Failures(clock)
        try:
            while (step := _guarded(watch.turn, poll, lost, failed)) not in ("ended", "lost"):
                if step == "wait":
                    sleep(poll)
            if step == "lost" and not lost():
                lose(f"its calls about the shards failed for {PATIENCE:g} s")
            if step != "ended":
                ended = watch.turn_without_prefect()
                watch.say_lost()  # after the first look: what it says has begun
                while not ended:
                    sleep(poll)
                    ended = watch.turn_without_prefect()
        finally:
            _end_ours(tracked)
    return [
        {"shard": s.index, "flow_run_id": str(s.run_id), "state": s.state, "message": s.message,
         "here": s.claimed_here}
        for s in tracked
    ]  # fmt: skip


UNKNOWN = "UNKNOWN"
"""A shard's state once Prefect's server is lost: it has ended (its process exited, or its lock stayed
free), but how is in its journal, not in a state the parent could read."""
ENDED = (*TERMINAL_STATES, UNKNOWN)

Step = Literal["ended", "again", "wait", "lost"]

PATIENCE = 600.0
"""Seconds of turns that all failed (Prefect's server answering with errors, or not at all, but never
refusing a connection) after which the parent counts the server as lost for its shards."""


@dataclass
class _Failures:
    """The turns that failed in a row (`_guarded`): since when, on the parent's clock."""

    clock: Callable[[], float]
    since: float | None = None


def _guarded(turn: Callable[[], Step], poll: float, lost: Callable[[], bool], failed: _Failures) -> Step:
    """`turn()`; "wait" when Prefect's server answered one of its calls with a server error or 429, or not
    at all (Prefect's client has asked again for about a minute): the next turn asks again; "lost" once
    turns have failed so for `PATIENCE` seconds, or at once when the run's health checks have lost the
    server (`lost()`) and a call is refused (its process is gone). A server that only stalls (SQLite's
    lock: its health checks time out too) is asked again, never written off before `PATIENCE`. Once the
    health checks have lost it, whatever a call raised counts as unanswered (Prefect's client, its retries
    cut short by `PrefectGuard.lose`, fails with errors of its own). Any other error raises."""
    import httpx
    from prefect.logging import get_run_logger

    try:
        step = turn()
    except Exception as exc:
        status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
        unanswered = isinstance(exc, httpx.TransportError) or status == 429 or (status or 0) >= 500
        if not (lost() or unanswered):
            raise
        if lost() and isinstance(exc, httpx.ConnectError):
            return "lost"
        failed.since = failed.clock() if failed.since is None else failed.since
        if failed.clock() - failed.since >= PATIENCE:
            return "lost"
        get_run_logger().warning(
            "Prefect's server did not answer about the shards (%s); asking again in %g s",
            status or type(exc).__name__, poll,
        )  # fmt: skip
        return "wait"
    failed.since = None
    return step


@dataclass
class _Watch:
    """The parent's watch over its shards' runs, a turn at a time (`run_shards`)."""

    client: Any
    tracked: list[_Shard]
    store: OutputStore
    shards: int
    clock: Callable[[], float]
    grace: float
    start_timeout: float
    never_started: float
    stopped: Callable[[], str | None]
    first: bool = True
    stopping: bool = False

    def turn(self) -> Step:
        """One look at the shards' runs through Prefect's API: "ended" once every one has, "again" right
        after a shard was claimed here, "wait" otherwise."""
        from prefect.logging import get_run_logger

        client, tracked, shards, clock = self.client, self.tracked, self.shards, self.clock
        if (why := self.stopped()) and not self.stopping:
            get_run_logger().warning("Stopping every shard of this run (%s); waiting for them to end", why)
            self.stopping = True
        if why:
            _signal_ours(tracked)  # before any call: ours stops even while the server fails
        _refresh(client, tracked, clock)
        if why:
            _stop_all(client, tracked, shards, why)
        if all(s.done(clock()) for s in tracked):
            _say_lingering(tracked, shards)
            return "ended"
        _reap(client, tracked, shards, self.stopping)
        if not self.stopping and not any(s.here for s in tracked):
            waited = 0.0 if self.first else self.start_timeout
            if _claim(client, tracked, clock, waited, shards) is not None:
                self.first = False
                return "again"
        for shard in tracked:  # ours: seen sending, so that its lock tells its end if Prefect is lost
            if shard.here is not None and not shard.seen_held:
                shard.seen_held = self.store.backend.shard_held(shard_name(shard.index, shards))
        _crash_dead(client, tracked, self.store, shards, clock, self.grace, self.never_started)
        return "wait"

    def say_lost(self) -> None:
        from prefect.logging import get_run_logger

        get_run_logger().warning(
            "Prefect's server is lost: each shard's end is read from its process or its lock now; the "
            "run's records are written once every shard has ended"
        )

    def turn_without_prefect(self) -> bool:
        """One look at the shards without Prefect's server; whether every one has ended (`_gone`). A stop
        reaches our own shard (SIGTERM); a worker's cannot be told (its worker learns of a cancellation
        from the server), so a stopping parent waits for none of them."""
        now = self.clock()
        if not self.stopping and (why := self.stopped()):
            self.stopping = True
            _say_stopping_without_prefect(why)
        if self.stopping:
            _signal_ours(self.tracked)
        for shard in self.tracked:
            if shard.state not in ENDED and (what := self._gone(shard, now)):
                _ended_unknown(shard, f"shard {shard_name(shard.index, self.shards)}: {what}")
        return all(s.done(now) for s in self.tracked)

    def _gone(self, shard: _Shard, now: float) -> str | None:
        """How `shard` has ended, seen without Prefect's server, or None while it may still run. Ours has
        ended when its process exits, or once its lock, seen held, has been free for `EXIT_WAIT` (its
        records are written; Prefect's engine can take minutes to give up on a lost server before the
        process exits: `_end_ours` stops it). A worker's, once its lock has been free for the grace when it
        was seen Running or holding it, or else for `never_started`: a worker may still start it if the
        server comes back. One that starts later finds the folder held alone while the records are
        written, and otherwise sends into its own journal, which the next run reads."""
        if shard.here is not None and (code := shard.here.poll()) is not None:
            shard.here, shard.ended_at = None, now
            return f"its process exited ({code})"
        held = self.store.backend.shard_held(shard_name(shard.index, self.shards))
        if self.stopping and shard.here is None:
            return ("still running on its worker" if held else "not running") + " when this run stopped"
        if held:
            shard.seen_held, shard.unheld_since = True, None
            return None
        shard.unheld_since = now if shard.unheld_since is None else shard.unheld_since
        free = now - shard.unheld_since
        if shard.here is not None:
            if shard.seen_held and free >= EXIT_WAIT:
                shard.ended_at = shard.unheld_since  # done at once: its process has had its EXIT_WAIT
                return f"its lock free for {free:.0f} s, its process still exiting"
            return None
        wait = self.grace if shard.seen_held or shard.state == "RUNNING" else self.never_started
        return f"its lock free for {free:.0f} s" if free > wait else None


def _ended_unknown(shard: _Shard, what: str) -> None:
    shard.state = UNKNOWN
    shard.message = f"{what} after Prefect's server was lost; its journal says what it sent"


def _signal_ours(tracked: list[_Shard]) -> None:
    """The parent is stopping: its own shard's process gets one SIGTERM (its graceful stop), never two."""
    import signal

    for shard in tracked:
        if shard.here is not None and not shard.told_to_stop:
            with contextlib.suppress(ProcessLookupError):
                shard.here.send_signal(signal.SIGTERM)
            shard.told_to_stop = True


def _say_stopping_without_prefect(why: str) -> None:
    from prefect.logging import get_run_logger

    get_run_logger().warning(
        "Stopping this run (%s): Prefect's server is lost, so only the shard this run started is stopped; "
        "a worker's shard still writing keeps the output until it ends, and the next run writes the records",
        why,
    )


def _say_lingering(tracked: list[_Shard], shards: int) -> None:
    from prefect.logging import get_run_logger

    for shard in tracked:
        if shard.here is not None and shard.here.poll() is None:
            get_run_logger().warning(
                "shard %s: its run ended (%s) but its process had not exited %g s later; stopping it",
                shard_name(shard.index, shards), str(shard.state).lower(), EXIT_WAIT,
            )  # fmt: skip


def _end_ours(tracked: list[_Shard]) -> None:
    """The parent is leaving: a shard process of its own still running is stopped. One whose run has ended
    (still sending its last log lines `EXIT_WAIT` seconds after its end, or its lock freed once Prefect's
    server was lost) gets a SIGTERM and, `KILL_AFTER` seconds later, a SIGKILL, and is reaped (its records
    are written: Prefect's engine, told of the SIGTERM, may go on trying to report a crash to a server that
    is gone). One still sending (the parent leaves on an error) gets its one graceful SIGTERM, unless the
    parent's stop already sent it (a second would abandon its requests in flight), and is left to finish
    its stop: it is reaped when the parent's process ends."""
    ended = [s.here for s in tracked if s.here is not None and s.here.poll() is None and s.state in ENDED]
    _signal_ours(tracked)
    for process in ended:
        try:
            process.wait(KILL_AFTER)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _refresh(client: Any, tracked: list[_Shard], clock: Callable[[], float]) -> None:
    """Each shard's state as the server has it, but for those whose end is known: a shard that has ended
    is not asked about again (a stop waits on no answer for it)."""
    for shard in tracked:
        if shard.state in TERMINAL_STATES:
            continue
        _read(client, shard)
        if shard.state in TERMINAL_STATES:
            shard.ended_at = clock()
        if shard.state != "PENDING":
            shard.pending_since = None
        elif shard.pending_since is None:
            shard.pending_since = clock()


def _read(client: Any, shard: _Shard) -> None:
    run = client.read_flow_run(shard.run_id)
    shard.state = run.state.type.value if run.state else None
    shard.message = run.state.message if run.state else None


def _claim(
    client: Any, tracked: list[_Shard], clock: Callable[[], float], waited: float, shards: int
) -> _Shard | None:
    """Claim the first shard no worker has claimed for `waited` seconds, and start it here."""
    from prefect.logging import get_run_logger
    from prefect.states import Pending

    for shard in tracked:
        if shard.state != "SCHEDULED" or clock() - shard.created < waited:
            continue
        env = _environment(client, shard.run_id)  # read before the claim: nothing to ask once it is ours
        result = client.set_flow_run_state(shard.run_id, Pending())
        if result.status.value != "ACCEPT":
            continue  # a worker claimed it first
        if waited:
            get_run_logger().warning(
                "shard %s: no worker started it within %g s; running it in this run's process "
                "(give each machine a worker with --limit 1 for one shard per machine)",
                shard_name(shard.index, shards), waited,
            )  # fmt: skip
        shard.here, shard.claimed_here = shard_child.start(shard.run_id, env), True
        return shard
    return None


def _environment(client: Any, run_id: Any) -> dict[str, str]:
    """The environment of a shard's child process, as a process worker gives a run's: this process's (the
    worker gave it the service), the API this run talks to, and the deployment's job variables' `env`
    (the heartbeat frequency)."""
    from prefect.settings import PREFECT_API_URL

    run = client.read_flow_run(run_id)
    job_env = client.read_deployment(run.deployment_id).job_variables.get("env") or {}
    env = {**os.environ, **{k: str(v) for k, v in job_env.items()}, "PREFECT__FLOW_RUN_ID": str(run_id)}
    if url := PREFECT_API_URL.value():
        env["PREFECT_API_URL"] = str(url)
    return env


def _stop_all(client: Any, tracked: list[_Shard], shards: int, why: str) -> None:
    """Stop every shard of a run that is stopping, each told once (a turn that failed halfway tells the
    rest on the next): the one running here gets one SIGTERM (its own graceful stop: what is in flight
    finishes and is recorded); one a worker runs is set Cancelling (its worker sends it the same SIGTERM);
    one not yet started is Cancelled, so that no worker runs it later."""
    from prefect.states import Cancelled, Cancelling

    _signal_ours(tracked)
    for shard in tracked:
        name = shard_name(shard.index, shards)
        if shard.told_to_stop or shard.here is not None:
            continue
        if shard.state in ("SCHEDULED", "PENDING"):
            message = f"shard {name}: not started; the sharded run stopped ({why})"
            _end(client, shard, Cancelled(message=message))
        elif shard.state == "RUNNING":
            client.set_flow_run_state(shard.run_id, Cancelling(message=f"the sharded run stopped ({why})"))
        else:
            continue  # ended, or between states: told on a later turn if it runs
        shard.told_to_stop = True


def _reap(client: Any, tracked: list[_Shard], shards: int, stopping: bool) -> None:
    """A shard process of ours that has exited: its run is final (read again: it may have reported its end
    after the last read), or it ended before its flow run began while the run was stopping (our SIGTERM
    reached it while it started) and is Cancelled, or it died and is marked Crashed."""
    from prefect.states import Cancelled, Crashed

    for shard in tracked:
        if shard.here is None or (code := shard.here.poll()) is None:
            continue
        if shard.state not in TERMINAL_STATES:
            _read(client, shard)
        name = shard_name(shard.index, shards)
        if shard.state in TERMINAL_STATES:
            pass
        elif stopping and shard.state in ("SCHEDULED", "PENDING"):
            _end(client, shard, Cancelled(message=f"shard {name}: not started; the sharded run stopped"))
        else:
            _end(client, shard, Crashed(message=f"shard {name}: its process exited ({code}) before it ended"))
        shard.here = None  # only now: a call above that failed leaves it to the next turn


def _end(client: Any, shard: _Shard, state: Any) -> None:
    """Set a shard's run to a final state of ours (forced: it is not running), and know it as ended."""
    client.set_flow_run_state(shard.run_id, state, force=True)
    shard.state, shard.message = state.type.value, state.message


def _crash_dead(
    client: Any,
    tracked: list[_Shard],
    store: OutputStore,
    shards: int,
    clock: Callable[[], float],
    grace: float,
    never_started: float,
) -> None:
    """Mark Crashed a worker's shard that never started, or that runs with its lock free (its machine
    died: it never reports an end)."""
    from prefect.states import Crashed

    for shard in tracked:
        name = shard_name(shard.index, shards)
        if shard.here is not None:
            continue
        gone = None
        if shard.pending_since is not None and clock() - shard.pending_since > never_started:
            gone = f"shard {name}: a worker claimed it but it had not started {never_started:g} s later"
        held = shard.state == "RUNNING" and store.backend.shard_held(name)
        shard.seen_held = shard.seen_held or held
        if shard.state != "RUNNING" or held:
            shard.unheld_since = None
        elif shard.unheld_since is None:
            shard.unheld_since = clock()
        elif clock() - shard.unheld_since > grace:
            gone = f"shard {name}: its process is gone (lock free for {grace:g} s)"
        if gone:
            _end(client, shard, Crashed(message=gone))
