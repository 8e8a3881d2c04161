"""Many machines: a run split into shards that run as separate flow runs on a work pool's workers.

The parent run (`shards=N`) plans once, starts a run of the shard deployment (`NAME-shards`, made by
`imagebatch deploy --shards N`) with Prefect's `run_deployment` for each of the N shards that has something
to send, runs the first itself (and any shard no worker takes within a minute: `run_shards`), so that it
never holds a worker's slot only to wait, waits for the others, merges what they wrote and writes the run's
records. Shard `I` sends the units whose request's first sample's idempotency key falls to it (`shard_of`),
so no two machines ever send one request; a chain's turns and a request's later samples stay together, and a
shard keeps only its own jobs as it reads the manifest (`shard_keeps`). Every shard writes into the one
output folder (a network file system in production), each into its own journal and usage file
(`journal.shard-I-of-N.jsonl`), holding the folder's lock shared and its own shard lock alone. Into an
object store's prefix (a bucket: the machines share nothing else), each writes its own journal segments
(`journal/<run>-I-of-N-<seq>.jsonl`) under a lease of its own, while the parent holds the prefix's lease for
the whole run (`Backend.hold_sharded`, `shard_hold`); the parent compacts the segments into one object
once every shard has ended.

What the folder must give across machines (NFSv4 does): a file renamed into place is seen whole
(`rename` is atomic within a directory), an `fsync` is durable on the server, and `flock` locks are seen
by every client (Linux maps them to NFS byte-range locks). Nothing else is shared: each shard appends
only to its own files, and the merge into `journal.jsonl` happens while the parent holds the folder alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from imagebatch.gateway.constants import ENV_API_KEY, STORE_SECRETS
from imagebatch.manifest import Job
from imagebatch.manifest.plan import idempotency_key, key_digits
from imagebatch.options import START_TIMEOUT, RunOptions, ShardRole, split_budgets
from imagebatch.run.constants import NEVER_STARTED, SHARD_GRACE, TERMINAL_STATES
from imagebatch.work.context import Unit, decide
from imagebatch.work.records import carried, not_attempted
from imagebatch.work.store import KeyState, OutputLockedError, OutputStore, RequestRecord


def shard_of(unit: Unit, shards: int) -> int:
    """Which shard sends `unit`: by the idempotency key of its request's first sample (turn 0, variant 1),
    so the split is the same on every machine and every rerun (a key's hex digits are uniform), a chain's
    turns and every later sample of a request go to one shard, and a shard knows its jobs from the
    manifest's rows alone (`shard_keeps`)."""
    first = unit.requests[0]
    if first.variant == 1 and first.turn_index == 0:
        return _shard_of_key(first.idempotency_key, shards)
    return _shard_of_key(idempotency_key(first.job, first.request_index), shards)


def _shard_of_key(key: str, shards: int) -> int:
    return int(key_digits(key)[:8], 16) % shards


def shard_keeps(shard: int, shards: int) -> Callable[[Job], bool]:
    """Whether a job has a unit that shard `shard` sends (`shard_of`): what a shard keeps of the manifest
    as it reads it (`manifest.load_manifest`'s `keep`), so that it never holds the others' jobs."""

    def keeps(job: Job) -> bool:
        return any(_shard_of_key(idempotency_key(job, i), shards) == shard for i in range(job.count))

    return keeps


def shard_name(shard: int, shards: int) -> str:
    return f"{shard}-of-{shards}"


def requests_to_send(
    options: RunOptions, units: Iterable[Unit], before: Mapping[str, KeyState], held: frozenset[str]
) -> list[int]:
    """Per shard, how many requests it has to send as the parent found the output (each shard decides
    the same from the same state: `work.context.decide`)."""
    shards, resend = options.sharding.shards, options.resend
    to_send = [0] * shards
    for unit in units:
        to_send[shard_of(unit, shards)] += sum(
            decide(before.get(k), force=resend.force, retry_unknown=resend.retry_unknown, held=k in held)
            == "send"
            for k in (r.idempotency_key for r in unit.requests)
        )
    return to_send


def shard_parameters(
    manifest: str, out: str, options: RunOptions, to_send: list[int]
) -> dict[int, dict[str, Any]]:
    """The flow parameters of each shard with something to send (`to_send`, from `requests_to_send`):
    the parent's options whole (a new option reaches the shards unasked), but for its part of the run's
    budgets, split by each shard's requests to send (`split_budgets`: the parts add up to the whole), and
    its number. A shard with nothing to send is not started: its run would only start a flow process (and,
    with no free worker, keep the parent waiting the start timeout) to send nothing."""
    return {
        i: {
            "manifest": manifest,
            "out": out,
            "options": options.model_copy(update={"budgets": part}).model_dump(mode="json"),
            "role": ShardRole(shard=i).model_dump(mode="json"),
        }
        for i, part in enumerate(split_budgets(options.budgets, to_send))
        if to_send[i]
    }


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
    pending_since: float | None = None
    unheld_since: float | None = None
    ended_at: float | None = None
    """When the parent first read its run in a final state."""

    def done(self, now: float) -> bool:
        """Its run is final and its process, if ours, has exited or has had `EXIT_WAIT` seconds to."""
        if self.state not in TERMINAL_STATES:
            return False
        return self.here is None or (self.ended_at is not None and now - self.ended_at >= EXIT_WAIT)


EXIT_WAIT = 10.0
"""Seconds a shard process of the parent's own may take to exit once its run is final (it holds no lock by
then: its records are written). Past them the parent goes on and stops it (`_end_ours`): a process that
reported its end to a server that no longer answers can wait a minute to send its last log lines, which
would take a stopping parent past its own grace."""


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
) -> list[dict[str, Any]]:
    """Start the shard runs of `deployment` (sub-runs of this one, a run per shard in `parameters`, from
    `shard_parameters`), run some here, wait until each ends. Returns, per shard started, its number, its
    flow run's id, final state and message, and whether the parent ran it (`here`).

    The parent holds a worker's slot, so it never only waits there (a pool of concurrency 1, or one
    worker started with `--limit 1`, would deadlock): it claims the first at once, and any shard no worker
    has claimed within `start_timeout` seconds once its own is done, as a worker claims a run (proposing
    Pending: the server accepts one claim only) and runs it in a child process with Prefect's own flow
    engine (`run.shard_child`). One at a time: the parent's slot is one run's worth of its machine.

    A shard a worker claimed that is not Running `never_started` seconds later (its worker died between
    claim and start) is marked Crashed, and so is a Running one whose lock has been free for `grace`
    seconds (`SHARD_GRACE`; its machine died: the process held its shard lock while it sent). The run goes
    on without them: what they sent without an answer is `unknown`, what they never sent is sent by the
    next run. Once `stopped()` gives a reason (the parent's own stop), every shard stops (`_stop_all`)."""
    from prefect.client.orchestration import get_client

    tracked = _start(deployment, parameters, shards, clock, sleep, stopped)
    first, stopping = True, False
    with get_client(sync_client=True) as client:
        try:
            while True:
                _refresh(client, tracked, clock)
                if not stopping and (why := stopped()):
                    stopping = _stop_all(client, tracked, shards, why)
                if all(s.done(clock()) for s in tracked):
                    _say_lingering(tracked, shards)
                    break
                _reap(client, tracked, shards, stopping)
                if not stopping and not any(s.here for s in tracked):
                    waited = 0.0 if first else start_timeout
                    if _claim(client, tracked, clock, waited, shards) is not None:
                        first = False
                        continue
                _crash_dead(client, tracked, store, shards, clock, grace, never_started)
                sleep(poll)
        finally:
            _end_ours(tracked)
    return [
        {"shard": s.index, "flow_run_id": str(s.run_id), "state": s.state, "message": s.message,
         "here": s.claimed_here}
        for s in tracked
    ]  # fmt: skip


def _start(
    deployment: str,
    parameters: dict[int, dict[str, Any]],
    shards: int,
    clock: Callable[[], float],
    sleep: Callable[[float], None] = time.sleep,
    stopped: Callable[[], str | None] = lambda: None,
) -> list[_Shard]:
    """The shard runs of `deployment`, created as sub-runs of this one (none started yet), each under an
    idempotency key of this run and its shard: a creation asked again after an answer that did not come
    (Prefect's client, or `created` below, for a server stalled under load) gives back the same run, never
    a second run of the shard that nobody tracks and a worker would start once this run has ended."""
    from prefect.context import FlowRunContext
    from prefect.deployments import run_deployment

    context = FlowRunContext.get()
    parent = context.flow_run.id if context is not None and context.flow_run is not None else None
    started = {}
    for i, shard in parameters.items():
        name = f"shard {shard_name(i, shards)}"
        key = f"imagebatch-shard:{parent}:{i}" if parent else None
        ask = partial(
            run_deployment, deployment, parameters=shard, timeout=0, as_subflow=True, flow_run_name=name,
            idempotency_key=key,
        )  # fmt: skip
        started[i] = created(ask, name, clock, sleep, stopped, CREATE_PATIENCE if key else 0.0)
    return [_Shard(i, run.id, clock()) for i, run in started.items()]


CREATE_PATIENCE = 600.0
"""Seconds the parent goes on asking Prefect's server to create a shard's run while it answers with a
server error or not at all (each ask is Prefect's client's, which has retried for about a minute): a
server stalled for minutes by a busy night (SQLite answering 503 while its database is locked) delays the
run rather than failing it before it sends anything."""


def created(
    ask: Callable[[], Any],
    name: str,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    stopped: Callable[[], str | None],
    patience: float = CREATE_PATIENCE,
) -> Any:
    """`ask()`'s answer, asked again (5 s, 10 s, ... up to a minute apart) after a server error (5xx) or no
    answer, for `patience` seconds; anything else, a stop (`stopped()`), or the end of patience raises.
    Only for a creation that is safe to ask again: one under an idempotency key."""
    import httpx
    from prefect.logging import get_run_logger

    deadline, wait = clock() + patience, 5.0
    while True:
        try:
            return ask()
        except (httpx.HTTPStatusError, httpx.TransportError) as exc:
            status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
            if (status is not None and status < 500) or stopped() or clock() + wait > deadline:
                raise
            get_run_logger().warning(
                "%s: Prefect's server did not create its run (%s); asking again in %g s (the same "
                "idempotency key: never a second run)", name, status or type(exc).__name__, wait,
            )  # fmt: skip
            sleep(wait)
            wait = min(2 * wait, 60.0)


def _say_lingering(tracked: list[_Shard], shards: int) -> None:
    from prefect.logging import get_run_logger

    for shard in tracked:
        if shard.here is not None and shard.here.poll() is None:
            get_run_logger().warning(
                "shard %s: its run ended (%s) but its process had not exited %g s later; stopping it",
                shard_name(shard.index, shards), str(shard.state).lower(), EXIT_WAIT,
            )  # fmt: skip


def _end_ours(tracked: list[_Shard]) -> None:
    """The parent is leaving (an error, or its shards' runs have ended): a shard process it started that is
    still running is stopped (one still sending its last log lines `EXIT_WAIT` seconds after its end)."""
    for shard in tracked:
        if shard.here is not None and shard.here.poll() is None:
            shard.here.terminate()


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
        result = client.set_flow_run_state(shard.run_id, Pending())
        if result.status.value != "ACCEPT":
            continue  # a worker claimed it first
        if waited:
            get_run_logger().warning(
                "shard %s: no worker started it within %g s; running it in this run's process "
                "(give each machine a worker with --limit 1 for one shard per machine)",
                shard_name(shard.index, shards), waited,
            )  # fmt: skip
        shard.here, shard.claimed_here = _execute(client, shard.run_id), True
        return shard
    return None


def _execute(client: Any, run_id: Any) -> subprocess.Popen[bytes]:
    """Prefect's flow engine for the run in a child process (`run.shard_child`), as a process worker starts
    a run: this
    process's environment (the worker gave it the service) less the API key and the object stores'
    secrets (`STORE_SECRETS`), which go to the child on its stdin (`run.shard_child`: never in a child's
    environment), the API this run talks to, and the deployment's job variables' `env` (the heartbeat
    frequency)."""
    from prefect.settings import PREFECT_API_URL

    run = client.read_flow_run(run_id)
    job_env = client.read_deployment(run.deployment_id).job_variables.get("env") or {}
    env = {**os.environ, **{k: str(v) for k, v in job_env.items()}, "PREFECT__FLOW_RUN_ID": str(run_id)}
    secrets = {name: env.pop(name) for name in (ENV_API_KEY, *STORE_SECRETS) if name in env}
    if url := PREFECT_API_URL.value():
        env["PREFECT_API_URL"] = str(url)
    command = [sys.executable, "-m", "imagebatch.run.shard_child", str(run_id)]
    # A session of its own: a signal to the parent's process group (a worker's, a cancellation's) stops
    # the parent, which stops this child with one signal of its own (`_stop_all`), never two.
    child = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, start_new_session=True)
    assert child.stdin is not None
    with contextlib.suppress(BrokenPipeError), child.stdin:  # a child that died at once is reaped as such
        child.stdin.write(json.dumps(secrets).encode() + b"\n")
    return child


def _stop_all(client: Any, tracked: list[_Shard], shards: int, why: str) -> bool:
    """Stop every shard of a run that is stopping: the one running here gets one SIGTERM (its own graceful
    stop: what is in flight finishes and is recorded); one a worker runs is set Cancelling (its worker
    sends it the same SIGTERM); one not yet started is Cancelled, so that no worker runs it later."""
    import signal

    from prefect.logging import get_run_logger
    from prefect.states import Cancelled, Cancelling

    for shard in tracked:
        name = shard_name(shard.index, shards)
        if shard.here is not None:
            with contextlib.suppress(ProcessLookupError):
                shard.here.send_signal(signal.SIGTERM)
        elif shard.state in ("SCHEDULED", "PENDING"):
            message = f"shard {name}: not started; the sharded run stopped ({why})"
            _end(client, shard, Cancelled(message=message))
        elif shard.state == "RUNNING":
            client.set_flow_run_state(shard.run_id, Cancelling(message=f"the sharded run stopped ({why})"))
    get_run_logger().warning("Stopping every shard of this run (%s); waiting for them to end", why)
    return True


def _reap(client: Any, tracked: list[_Shard], shards: int, stopping: bool) -> None:
    """A shard process of ours that has exited: its run is final (read again: it may have reported its end
    after the last read), or it ended before its flow run began while the run was stopping (our SIGTERM
    reached it while it started) and is Cancelled, or it died and is marked Crashed."""
    from prefect.states import Cancelled, Crashed

    for shard in tracked:
        if shard.here is None or (code := shard.here.poll()) is None:
            continue
        shard.here = None
        if shard.state not in TERMINAL_STATES:
            _read(client, shard)
        name = shard_name(shard.index, shards)
        if shard.state in TERMINAL_STATES:
            continue
        if stopping and shard.state in ("SCHEDULED", "PENDING"):
            _end(client, shard, Cancelled(message=f"shard {name}: not started; the sharded run stopped"))
        else:
            _end(client, shard, Crashed(message=f"shard {name}: its process exited ({code}) before it ended"))


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
        if shard.state != "RUNNING" or store.backend.shard_held(name):
            shard.unheld_since = None
        elif shard.unheld_since is None:
            shard.unheld_since = clock()
        elif clock() - shard.unheld_since > grace:
            gone = f"shard {name}: its process is gone (lock free for {grace:g} s)"
        if gone:
            _end(client, shard, Crashed(message=gone))


def shards_released(
    store: OutputStore,
    shards: int,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    poll: float = 2.0,
) -> None:
    """Return once no shard of the run holds its own hold; `OutputLockedError` naming the shard otherwise,
    after the location's `release_wait`: a shard killed (the parent's own child, its run marked Crashed at
    once) leaves an object store's lease live until it expires, and one that still holds it then is alive
    and writing (its run marked ended meanwhile), and the parent must not compact the journal under it.
    A folder's lock goes with its process: none is waited for."""
    deadline = clock() + store.backend.release_wait
    while held := [n for i in range(shards) if store.backend.shard_held(n := shard_name(i, shards))]:
        if clock() > deadline:
            raise OutputLockedError(f"shard {held[0]} (still writing) is using {store.where}")
        sleep(poll)


def records_after(
    units: Iterable[Unit], before: Mapping[str, KeyState], after: Mapping[str, KeyState], why_unsent: str
) -> Iterator[tuple[int, list[RequestRecord]]]:
    """The parent's records, unit by unit (its index and its records), from the folder's state before the
    shards ran and after: a request that has succeeded only since is `succeeded`, one that had before
    `skipped`; the others carry their outcome, and one no shard reached is `not_attempted`."""
    for unit in units:
        out = []
        for req in unit.requests:
            now = after.get(req.idempotency_key)
            if now is None or now.status is None:
                out.append(not_attempted(req, why_unsent))
                continue
            record = carried(req, now)
            was = before.get(req.idempotency_key)
            if now.status == "succeeded" and not (was is not None and was.status == "succeeded"):
                record.status = "succeeded"
            out.append(record)
        yield unit.index, out
