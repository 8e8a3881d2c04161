"""The batch flow: check -> plan -> skip what is done -> dispatch -> records.

`generate_from_manifest` only orchestrates: requests are sent by the `generate` task
(`imagebatch.tasks.generate`), dispatch is `flows/dispatch.py`, the files are kept by
`imagebatch.tasks.store`. Tasks return nothing (their records go to the run context), so Prefect keeps no
per-task results in memory.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import prefect
from prefect import flow
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.logging import get_run_logger
from prefect.runtime import deployment, flow_run
from prefect.task_runners import ThreadPoolTaskRunner

import imagebatch
from imagebatch.flows.artifacts import ProgressArtifact, budgets, spend, summary_markdown, usage_table
from imagebatch.flows.config import (
    DEFAULT_CONCURRENCY,
    MAX_CONCURRENCY,
    Preflight,
    UsageError,
    key_source,
    locked,
    preflight,
    resolve_api_key,
)
from imagebatch.flows.dispatch import ProgressSnapshot, RunControl, dispatch
from imagebatch.flows.limits import SlotBroker, check_limit
from imagebatch.flows.shards import START_TIMEOUT, records_after, run_shards, shard_name, shard_of
from imagebatch.gateway import GatewayClient
from imagebatch.manifest import plan
from imagebatch.report import build_report
from imagebatch.tasks.context import Pacer, RunContext, Unit, group_units
from imagebatch.tasks.records import storage_message
from imagebatch.tasks.store import STATUSES, OutputLockedError, OutputStore, RequestRecord
from imagebatch.tasks.usage import usage_summary, write_usage_summary


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
    checked: Preflight | None = None
    """The command's own preflight of the same run, so the flow does not load the manifest again."""
    shard_grace: float = 120.0
    """How long a Running shard's lock may be free before its run counts as crashed (`flows.shards`)."""
    signals: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    """The command's Ctrl-C/SIGTERM handling, installed again around dispatch (Prefect's flow engine
    installs its own SIGTERM handler, which crashes the run instead of stopping it)."""


_hooks: ContextVar[RunHooks | None] = ContextVar("imagebatch_run_hooks", default=None)


@contextlib.contextmanager
def run_hooks(hooks: RunHooks) -> Iterator[RunHooks]:
    """Use `hooks` for the flows run inside this block (in this thread)."""
    token = _hooks.set(hooks)
    try:
        yield hooks
    finally:
        _hooks.reset(token)


@contextlib.contextmanager
def service(base_url: str | None, secret_block: str | None, hooks: RunHooks) -> Iterator[tuple[str, str]]:
    """Yield (base_url, api_key): the configured service, or the embedded emulator (no base URL)."""
    if base_url:
        key = resolve_api_key(secret_block)
        if not key:
            why = f"set {key_source(None)} or name a Prefect Secret block"
            raise UsageError(f"no API key for {base_url}: {why}")
        yield base_url, key
        return
    from imagebatch.gateway.emulator import EmulatorServer, EmulatorSettings

    key = "emulator-" + secrets.token_hex(16)
    with EmulatorServer(EmulatorSettings(api_key=key, **hooks.emulator_settings)) as server:
        get_run_logger().info(
            "No service address configured: using the embedded emulator at %s; "
            "its images are placeholders, not real generations.",
            server.url,
        )
        yield server.url, key


@contextlib.contextmanager
def held(store: OutputStore) -> Iterator[None]:
    """The output folder's lock for this run (a second run into it would send twice)."""
    try:
        with store.shard_hold() if store.shard else store.exclusive():
            yield
    except OutputLockedError as exc:
        raise locked(exc) from None


@contextmanager
def forward_logs_to_prefect(*names: str) -> Iterator[None]:
    """Send our loggers' records (the client's retry waits) to Prefect's run log too, as Prefect's own
    `PREFECT_LOGGING_EXTRA_LOGGERS` does, so that it works however the flow is started; only while
    the flow runs (outside a flow run Prefect's API handler has nowhere to send them)."""
    handlers = logging.getLogger("prefect.extra").handlers
    added: list[tuple[logging.Logger, logging.Handler]] = []
    for name in names:
        target = logging.getLogger(name)
        added += [(target, h) for h in handlers if h not in target.handlers]
    for target, handler in added:
        target.addHandler(handler)
    try:
        yield
    finally:
        for target, handler in added:
            target.removeHandler(handler)


@flow(
    name="generate_from_manifest",
    # At most one batch per unit in flight, plus the one being admitted (see flows.dispatch).
    task_runner=ThreadPoolTaskRunner(max_workers=MAX_CONCURRENCY + 1),  # type: ignore[arg-type]  # Prefect's own generics
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
    rpm: int | None = None,
    adaptive: bool = True,
    max_images: int | None = None,
    max_spend: float | None = None,
    prices: str | None = None,
    global_limit: str | None = None,
    report: bool = True,
    shards: int = 1,
    shard: int | None = None,
    shard_deployment: str | None = None,
    shard_start_timeout: float = START_TIMEOUT,
) -> dict[str, Any]:
    """Generate every image a manifest asks for into `out`, resuming from what `out` already holds.

    The API key is read from the Prefect Secret block named by `api_key_secret_block`, else from
    `IMAGEBATCH_API_KEY`; with no `base_url` (and no `IMAGEBATCH_BASE_URL`) the embedded emulator is used.
    `rpm` spaces request starts (60 / rpm seconds apart); `adaptive` (default) starts with a few requests
    in flight and adapts to the service's 429s (see `flows.dispatch.Window`), never above `concurrency`.
    `max_images` caps the images this run may deliver (see `flows.dispatch.dispatch`). `global_limit` names
    a Prefect global concurrency limit whose slot each request holds on the wire (`flows.limits`). With
    `report=False` no thumbnail is made and no `report.html` written (`imagebatch report OUT` makes them
    later): a thumbnail costs ~15 ms of CPU per 1K image, as much as the rest of a request's work.
    With `shards` > 1 the run starts that many runs of `shard_deployment` (each `shard` I of them sends
    its share) on a work pool's workers (shard 0, and one no worker starts within `shard_start_timeout`
    seconds, run in this run's process), waits, and writes the records (see `flows.shards`).
    Returns the run summary (counts by status, paths), which is also written to `out/run.json`.
    """
    hooks = _hooks.get() or RunHooks()
    checked = hooks.checked or preflight(
        manifest, out, concurrency=concurrency, base_url=base_url,
        api_key_secret_block=api_key_secret_block, rpm=rpm, max_images=max_images,
        max_spend=max_spend, prices=prices, shard=shard is not None,
        deployed=deployment.id is not None,
    )  # fmt: skip
    if shards < 1 or (shard is not None and not 0 <= shard < shards):
        raise UsageError(f"shard {shard} of {shards}: shards must be 1 or more, and a shard 0 to shards - 1")
    rate_limit = check_limit(global_limit) if global_limit else None  # a missing limit is refused here
    units = group_units(plan(checked.manifest))
    planned = sum(len(unit.requests) for unit in units)
    info = run_info(checked, planned, concurrency, force, retry_unknown, api_key_secret_block)
    info["options"] |= {"global_limit": global_limit, "report": report, "shards": shards, "shard": shard}
    if shards > 1 and shard is None:
        if not shard_deployment:
            raise UsageError(f"{shards} shards need the deployment their runs use (shard_deployment)")
        parameters = {
            "manifest": str(checked.manifest.path), "out": str(checked.out.resolve()),
            "concurrency": concurrency, "base_url": base_url, "force": force,
            "retry_unknown": retry_unknown, "api_key_secret_block": api_key_secret_block, "rpm": rpm,
            "adaptive": adaptive, "prices": prices, "global_limit": global_limit, "report": report,
        }  # fmt: skip
        store = OutputStore(checked.out)
        with held(store):  # nothing else runs into the folder; the last sharded run's files are merged
            before = store.load_state()
        runs = run_shards(
            shard_deployment, parameters, shards, store, sleep=hooks.sleep, grace=hooks.shard_grace,
            start_timeout=shard_start_timeout,
        )  # fmt: skip
        with held(store):  # every shard has ended: merge their journals, then the records
            after = store.load_state()
            failed = [
                f"shard {i}: {r['state']} ({r['message']})"
                for i, r in enumerate(runs)
                if r["state"] != "COMPLETED"
            ]
            results = records_after(units, before, after, "; ".join(failed) or "no shard sent it")
            info["shard_runs"] = runs
            # No task runs of its own to wait for at the end (the shards record theirs).
            return _record(checked, store, units, results, info, "; ".join(failed) or None, 0, report)
    if shard is not None:
        units = [u for u in units if shard_of(u, shards) == shard]
        info["requests"] = sum(len(unit.requests) for unit in units)
    store = OutputStore(checked.out, shard_name(shard, shards) if shard is not None else None)
    with (
        forward_logs_to_prefect("imagebatch"),
        service(checked.base_url, api_key_secret_block, hooks) as (url, key),
        held(store),
    ):
        store.prepare()
        if shard is None:
            store.write_run(info)  # a crash leaves a run.json that says the run never ended
        slots = SlotBroker(global_limit, rate_limit) if global_limit else None
        client = GatewayClient(
            url, key, sleep=hooks.sleep, transport=hooks.transport, slot=slots or contextlib.nullcontext
        )
        ctx = RunContext(
            client, store, store.load_state(),
            force=force, retry_unknown=retry_unknown, key_source=key_source(api_key_secret_block),
            thumbnails=report,
        )  # fmt: skip
        with (
            client,
            slots or contextlib.nullcontext(),
            hooks.signals() if hooks.signals else contextlib.nullcontext(),
        ):
            if rpm:
                ctx.pacer = Pacer(60.0 / rpm, sleep=hooks.sleep)
            progress = ProgressArtifact(hooks.on_progress)
            caps = budgets(max_images, max_spend, checked.prices)
            tasks = dispatch(ctx, units, concurrency, hooks.control, progress, adaptive, caps)
            progress.close()
        try:
            if shard is not None:  # the parent writes the run's records once every shard has ended
                counts = Counter(r.status for unit in units for r in ctx.results[unit.index])
                ended = datetime.now(UTC).isoformat()
                info |= {"ended_at": ended, "stopped": ctx.halt_reason, "counts": counts}
                return info
            return _record(checked, store, units, ctx.results, info, ctx.halt_reason, tasks, report)
        finally:
            ctx.results.close()


class _Records:
    """The run's records in manifest order, read from `results` again on each iteration."""

    def __init__(self, units: list[Unit], results: Mapping[int, list[RequestRecord]]) -> None:
        self.units, self.results = units, results

    def __iter__(self) -> Iterator[RequestRecord]:
        for unit in self.units:
            yield from self.results[unit.index]


def _record(
    checked: Preflight,
    store: OutputStore,
    units: list[Unit],
    results: Mapping[int, list[RequestRecord]],
    info: dict[str, Any],
    halt_reason: str | None,
    tasks: int,
    report: bool,
) -> dict[str, Any]:
    """Write the run's records (results.csv, usage-summary.csv, run.json, report.html) and its Prefect
    artifacts; return the run summary."""
    price_table = checked.prices
    records = _Records(units, results)  # read back from the spool on each pass, never all at once
    by_job = {job.id: job for job in checked.manifest.jobs}
    rows = ({**by_job[r.job_id].metadata, **r.to_row()} for r in records)
    unwritten: list[str] = []
    with contextlib.suppress(OSError):  # what a replay needs was synced as it was written; this is the rest
        store.sync()
    try:
        store.write_results(rows, list(checked.manifest.metadata_columns))
    except OSError as exc:
        unwritten.append(f"results.csv not written: {storage_message(store.root, exc)}")
    usage = usage_summary(store.root, records)
    try:
        write_usage_summary(store.root, usage)
    except OSError as exc:
        unwritten.append(f"usage-summary.csv not written: {storage_message(store.root, exc)}")
    counts = Counter(r.status for r in records)
    info["usage"] = [row.to_dict() for row in usage]
    if price_table is not None:
        info["spend"] = spend(units, results, price_table)
    info["rate_limited"] = sum(r.status == "failed" and "HTTP 429" in (r.error or "") for r in records)
    info |= {
        "ended_at": datetime.now(UTC).isoformat(),
        "state": "stopped" if halt_reason else "finished",
        "counts": {s: counts.get(s, 0) for s in STATUSES},
        "stopped": halt_reason,
        "prefect": {"flow_run_id": str(flow_run.id) if flow_run.id else None, "task_runs": tasks},
    }
    try:
        store.write_run(info)
    except OSError as exc:
        unwritten.append(f"run.json not written: {storage_message(store.root, exc)}")
    try:
        if report:
            plan = {req.idempotency_key: req for unit in units for req in unit.requests}  # not loaded again
            info["report"] = str(build_report(store.root, details=plan))
    except Exception as exc:  # the report is a view of the records, never a reason to fail the run
        unwritten.append(f"report.html not written: {exc}")
    if unwritten:
        info["unwritten"] = unwritten  # the command prints them; the records above are all there is
    create_markdown_artifact(
        key="imagebatch-run-summary", markdown=summary_markdown(info), description="imagebatch run"
    )
    if info.get("report"):
        create_link_artifact(
            Path(info["report"]).resolve().as_uri(), link_text="report.html", key="imagebatch-report",
            description="the run's contact sheet (a file on the machine that ran it)",
        )  # fmt: skip
    create_table_artifact(
        key="imagebatch-usage",
        table=usage_table(records, info["usage"]),
        description="requests by route, model and status, with the usage summary (all runs into the folder)",
    )
    with contextlib.suppress(Exception):  # best effort: the output folder is the record, not Prefect's
        settle_prefect_records(info)
    return info


def run_info(
    checked: Preflight,
    planned: int,
    concurrency: int,
    force: bool,
    retry_unknown: bool,
    secret_block: str | None,
) -> dict[str, Any]:
    """What `run.json` says of a run when it starts (`state: running` until it ends)."""
    return {
        "manifest": str(checked.manifest.path),
        "manifest_sha256": checked.manifest.sha256,
        "out": str(checked.out.resolve()),
        "service": checked.base_url or "embedded emulator",
        "options": {
            "concurrency": concurrency,
            "force": force,
            "retry_unknown": retry_unknown,
            "base_url": checked.base_url,
            "api_key_secret_block": secret_block,
        },
        "versions": {"imagebatch": imagebatch.__version__, "prefect": prefect.__version__},
        "started_at": datetime.now(UTC).isoformat(),
        "ended_at": None,
        "state": "running",
        "requests": planned,
    }


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
    middle of such a write (`CancelledError` tracebacks, "Error flushing events", on the user's terminal
    after a successful run, and the UI loses those states). Returns True once the server's count of
    finished task runs matches `info`, or False on timeout (the output folder is the record either way).
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
