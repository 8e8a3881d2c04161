"""The batch flow: manifest -> plan -> skip what is done -> dispatch one task per request -> records.

`generate_from_manifest` only orchestrates: the requests are sent by `imagebatch.tasks.generate`, the files
are kept by `imagebatch.tasks.store`. Dispatch is windowed: at most `concurrency` tasks are in flight, and
new ones are submitted as old ones finish, so a 100,000-row manifest never holds 100,000 futures and a 401
or 402 stops the run before the rest is sent. Tasks return nothing (their records go to the run context),
so Prefect keeps no per-task results in memory.
"""

from __future__ import annotations

import contextlib
import queue
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import prefect
from prefect import flow, tags, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

import imagebatch
from imagebatch.flows.config import (
    DEFAULT_CONCURRENCY,
    ENV_API_KEY,
    MAX_CONCURRENCY,
    UsageError,
    resolve_api_key,
    resolve_base_url,
)
from imagebatch.gateway.client import GatewayClient
from imagebatch.tasks.generate import RunContext, Unit, run_unit, run_unit_safely
from imagebatch.tasks.manifest import Manifest, load_manifest, plan
from imagebatch.tasks.store import STATUSES, OutputLockedError, OutputStore


@dataclass(frozen=True)
class ProgressSnapshot:
    """Where a run stands, for a progress display."""

    counts: dict[str, int]
    done: int
    planned: int
    in_flight: int
    images: int


class RunControl:
    """Lets another thread (or a signal handler) stop a run gracefully: no new request is sent, requests in
    flight finish and are recorded, the rest are `not_attempted`."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._wake: Callable[[], None] | None = None

    def stop(self, reason: str) -> None:
        self.reason = reason
        if self._wake is not None:
            self._wake()

    def attach(self, wake: Callable[[], None]) -> None:
        """Called by the dispatcher: how to wake it while it waits for a task."""
        self._wake = wake
        if self.reason is not None:
            wake()


@dataclass
class RunHooks:
    """Injected dependencies of a run: tests pass a recording sleep, the CLI a progress callback."""

    sleep: Callable[[float], None] = time.sleep
    transport: httpx.BaseTransport | None = None
    on_progress: Callable[[ProgressSnapshot], None] | None = None
    """Called from the flow's thread after each dispatch step and each finished unit."""
    emulator_settings: dict[str, Any] = field(default_factory=dict)
    """Extra settings for the embedded emulator (tests: faults, latency)."""
    control: RunControl = field(default_factory=RunControl)
    """Stops the run gracefully from outside (the CLI's Ctrl-C)."""


_hooks: ContextVar[RunHooks | None] = ContextVar("imagebatch_run_hooks", default=None)


@contextlib.contextmanager
def run_hooks(hooks: RunHooks) -> Iterator[RunHooks]:
    """Use `hooks` for the flows run inside this block (in this thread)."""
    token = _hooks.set(hooks)
    try:
        yield hooks
    finally:
        _hooks.reset(token)


@task(
    name="generate",
    task_run_name="{unit.name}",
    cache_policy=NO_CACHE,
    retries=0,  # the spec's schedule is applied per route by the client, not by re-running the task
)
def generate_request(ctx: RunContext, unit: Unit) -> None:
    """Send one planned request (or one chain's turns); the records go to `ctx.results`, never bytes."""
    ctx.results[unit.index] = run_unit_safely(ctx, unit)


def group_units(manifest: Manifest) -> list[Unit]:
    """One unit per (job, request index): a plain request, or a chain's turns in order."""
    units: dict[tuple[str, int], Unit] = {}
    for req in plan(manifest):
        key = (req.job_id, req.request_index)
        if key not in units:
            units[key] = Unit(len(units), req.job, [])
        units[key].requests.append(req)
    return list(units.values())


@contextlib.contextmanager
def service(
    base_url: str | None, secret_block: str | None, hooks: RunHooks
) -> Iterator[tuple[str, str, bool]]:
    """Yield (base_url, api_key, embedded): the configured service, or the embedded emulator."""
    url = resolve_base_url(base_url)
    if url:
        key = resolve_api_key(secret_block)
        if not key:
            raise UsageError(f"no API key: set {ENV_API_KEY} (or name a Prefect Secret block) for {url}")
        yield url, key, False
        return
    from imagebatch.gateway.emulator import EmulatorServer, EmulatorSettings

    key = "emulator-" + secrets.token_hex(16)
    with EmulatorServer(EmulatorSettings(api_key=key, **hooks.emulator_settings)) as server:
        yield server.url, key, True


@contextlib.contextmanager
def _held(store: OutputStore) -> Iterator[None]:
    try:
        with store.exclusive():
            yield
    except OutputLockedError as exc:
        raise UsageError(
            f"{exc}: wait for it to finish (two runs into one folder would send twice)"
        ) from None


def _summary_markdown(counts: Counter[str], info: dict[str, Any]) -> str:
    lines = [
        f"# imagebatch run: {info['manifest']}",
        "",
        f"Service: {info['service']}  ",
        f"Output: `{info['out']}`",
        "",
        "| status | requests |",
        "|-|-|",
    ]
    lines += [f"| {s} | {counts.get(s, 0)} |" for s in STATUSES]
    lines += [f"| **total** | {sum(counts.values())} |"]
    return "\n".join(lines)


@flow(
    name="generate_from_manifest",
    task_runner=ThreadPoolTaskRunner(max_workers=MAX_CONCURRENCY),
    log_prints=False,
    validate_parameters=True,
)
def generate_from_manifest(
    manifest: str,
    out: str,
    concurrency: int = DEFAULT_CONCURRENCY,
    base_url: str | None = None,
    force: bool = False,
    retry_unknown: bool = False,
    api_key_secret_block: str | None = None,
) -> dict[str, Any]:
    """Generate every image a manifest asks for into `out`, resuming from what `out` already holds.

    The API key is read from the Prefect Secret block named by `api_key_secret_block`, else from
    `IMAGEBATCH_API_KEY`; with no `base_url` (and no `IMAGEBATCH_BASE_URL`) the embedded emulator is used.
    Returns the run summary (counts by status, paths), which is also written to `out/run.json`.
    """
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise UsageError(f"concurrency must be from 1 to {MAX_CONCURRENCY}, not {concurrency}")
    hooks = _hooks.get() or RunHooks()
    logger = get_run_logger()
    started = datetime.now(UTC)
    loaded = load_manifest(Path(manifest))
    units = group_units(loaded)
    planned = sum(len(u.requests) for u in units)
    store = OutputStore(Path(out))
    if store.root.exists() and not store.root.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")

    with service(base_url, api_key_secret_block, hooks) as (url, key, embedded):
        if embedded:
            logger.info(
                "No service address configured: using the embedded emulator at %s; "
                "its images are placeholders, not real generations.",
                url,
            )
        info: dict[str, Any] = {
            "manifest": str(loaded.path),
            "manifest_sha256": loaded.sha256,
            "out": str(store.root.resolve()),
            "service": "embedded emulator" if embedded else url,
            "options": {
                "concurrency": concurrency,
                "force": force,
                "retry_unknown": retry_unknown,
                "base_url": None if embedded else url,
                "api_key_secret_block": api_key_secret_block,
            },
            "versions": {"imagebatch": imagebatch.__version__, "prefect": prefect.__version__},
            "started_at": started.isoformat(),
            "ended_at": None,
            "state": "running",
            "requests": planned,
        }
        with _held(store):
            store.prepare()
            store.write_run(info)  # a crash leaves a run.json that says the run never ended
            client = GatewayClient(url, key, sleep=hooks.sleep, transport=hooks.transport)
            ctx = RunContext(client, store, store.load_state(), force=force, retry_unknown=retry_unknown)
            try:
                tasks = _dispatch(ctx, units, concurrency, planned, hooks)
            finally:
                client.close()
            records = [r for unit in units for r in ctx.results[unit.index]]
            counts = Counter(r.status for r in records)
            by_job = {job.id: job for job in loaded.jobs}
            rows = ({**by_job[r.job_id].metadata, **r.to_row()} for r in records)
            store.write_results(rows, list(loaded.metadata_columns))
            info |= {
                "ended_at": datetime.now(UTC).isoformat(),
                "state": "stopped" if ctx.halt_reason else "finished",
                "counts": {s: counts.get(s, 0) for s in STATUSES},
                "stopped": ctx.halt_reason,
                "prefect": {"flow_run_id": str(flow_run.id) if flow_run.id else None, "task_runs": tasks},
            }
            store.write_run(info)
    create_markdown_artifact(
        key="imagebatch-run-summary", markdown=_summary_markdown(counts, info), description="imagebatch run"
    )
    # In the flow, not in the command, so that a script calling the flow exits as cleanly as the command.
    with contextlib.suppress(Exception):  # best effort: the output folder is the record, not Prefect's
        settle_prefect_records(info)
    return info


def _dispatch(ctx: RunContext, units: list[Unit], concurrency: int, planned: int, hooks: RunHooks) -> int:
    """Run every unit: at most `concurrency` tasks in flight, submitted in manifest order; after an account
    error, the units not yet submitted are recorded without sending. Returns the number of tasks submitted.
    """
    done_q: queue.Queue[Any] = queue.Queue()
    counts: Counter[str] = Counter()
    in_flight = submitted = images = 0

    def report() -> None:
        if hooks.on_progress:
            snap = ProgressSnapshot(dict(counts), sum(counts.values()), planned, in_flight, images)
            hooks.on_progress(snap)

    def finished(unit: Unit) -> None:
        nonlocal images
        records = ctx.results[unit.index]
        counts.update(r.status for r in records)
        images += sum(r.images for r in records if r.status == "succeeded")
        report()

    # Units this run sends nothing for never become tasks: no Prefect overhead, no request.
    todo: list[Unit] = []
    for unit in units:
        if any(ctx.decision(r.idempotency_key) == "send" for r in unit.requests):
            todo.append(unit)
        else:
            ctx.results[unit.index] = run_unit(ctx, unit)
            finished(unit)
    pending = iter(todo)
    hooks.control.attach(lambda: done_q.put(None))
    while True:
        if hooks.control.reason:
            ctx.stop_dispatch(hooks.control.reason)
        while in_flight < concurrency and not ctx.halt.is_set():
            unit = next(pending, None)
            if unit is None:
                break
            with tags(f"route:{unit.requests[0].route}", f"model:{unit.job.model}"):
                future = generate_request.submit(ctx, unit)
            future.add_done_callback(lambda _f, u=unit: done_q.put(u))
            in_flight += 1
            submitted += 1
        report()
        if in_flight == 0:
            break
        unit = done_q.get()
        if unit is None:  # woken by RunControl.stop: stop submitting, keep waiting for what is in flight
            continue
        in_flight -= 1
        if unit.index not in ctx.results:  # the task itself failed in Prefect, outside our code
            ctx.results[unit.index] = run_unit_safely(ctx, unit)
        finished(unit)
    for unit in pending:  # only left after a halt: records without sending (run_unit sends nothing now)
        ctx.results[unit.index] = run_unit(ctx, unit)
        finished(unit)
    return submitted


TERMINAL_STATES = ["COMPLETED", "FAILED", "CRASHED", "CANCELLED"]


def settle_prefect_records(
    info: dict[str, Any],
    *,
    timeout: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Wait until Prefect's server has recorded the final state of every task run of a finished flow run.

    Task-run states reach Prefect's server as events, which it writes to its database in batches, a
    moment after the flow has returned. A process that exits at once stops the ephemeral server in the
    middle of such a write, and the server prints `CancelledError` tracebacks ("Error flushing events")
    on the user's terminal after a successful run, and the UI loses those states. Call this before
    exiting: it returns True once the server's count of finished task runs matches `info`, or False on
    timeout (nothing is lost on our side either way: the output folder is the record).
    """
    from prefect.client.orchestration import get_client

    meta = info.get("prefect") or {}
    run_id, expected = meta.get("flow_run_id"), meta.get("task_runs", 0)
    if not run_id or not expected:
        return True
    body = {
        "flow_runs": {"id": {"any_": [run_id]}},
        "task_runs": {"state": {"type": {"any_": TERMINAL_STATES}}},
    }
    deadline = clock() + timeout
    with get_client(sync_client=True) as client:
        while True:
            response = client.request("POST", "/task_runs/count", json=body)
            if response.status_code == 200 and int(response.json()) >= expected:
                return True
            if clock() >= deadline:
                return False
            sleep(0.2)
