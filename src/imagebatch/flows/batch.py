"""The batch flow: check -> plan -> skip what is done -> dispatch -> records.

`generate_from_manifest` only orchestrates, in one of three modes: a run here (`run_here`), one shard of a
sharded run (`run_shard`), or the shards' parent (`run_parent`, with `run.shards`). Dispatch is
`run/dispatch.py` (with the `generate` task of `imagebatch.work.generate`), the end of the run (its
records and Prefect artifacts) `run/outputs.py`, the files are kept by `imagebatch.work.store`. Tasks
return nothing (their records go to the run context), so Prefect keeps no per-task results in memory.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prefect import flow
from prefect.logging import get_run_logger
from prefect.runtime import deployment
from prefect.task_runners import ThreadPoolTaskRunner

from imagebatch.gateway import GatewayClient
from imagebatch.manifest import plan
from imagebatch.run import api_guard as prefect_guard
from imagebatch.run.artifacts import ProgressArtifact, budgets
from imagebatch.run.constants import FLOW_NAME
from imagebatch.run.dispatch import dispatch
from imagebatch.run.final_state import concluded, ran_to_end
from imagebatch.run.hooks import RunHooks, current_hooks
from imagebatch.run.limits import SlotBroker, rate_limit_of
from imagebatch.run.outputs import run_info, write_records
from imagebatch.run.preflight import (
    DEFAULT_CONCURRENCY,
    MAX_CONCURRENCY,
    Preflight,
    UsageError,
    key_source,
    locked,
    out_text,
    preflight,
    resolve_api_key,
)
from imagebatch.run.shards import (
    START_TIMEOUT,
    records_after,
    run_shards,
    shard_name,
    shard_of,
    shards_released,
)
from imagebatch.work.context import Pacer, RunContext, Unit, group_units
from imagebatch.work.store import KeyState, OutputLockedError, OutputStore
from imagebatch.work.variants import redo_kinds, with_variants


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
def held(store: OutputStore, sharded: int = 0) -> Iterator[None]:
    """The output folder's lock for this run (a second run into it would send twice); `sharded`: for the
    whole of a sharded run's parent (`OutputStore.hold_sharded`: an object store's lease, nothing more
    for a folder)."""
    try:
        if sharded:
            hold = store.hold_sharded(sharded)
        else:
            hold = store.shard_hold() if store.shard else store.hold_and_merge()
        with hold:
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


@dataclass(frozen=True)
class RunOptions:
    """The flow's parameters after the manifest and the output folder, for the functions of each mode."""

    concurrency: int
    base_url: str | None
    force: bool
    retry_unknown: bool
    api_key_secret_block: str | None
    rpm: int | None
    adaptive: bool
    max_images: int | None
    max_spend: float | None
    prices: str | None
    global_limit: str | None
    report: bool
    shards: int
    shard: int | None
    shard_deployment: str | None
    files_root: list[str] | None = None
    allow_failures: str | None = None
    shard_start_timeout: float = START_TIMEOUT
    redo: str | None = None
    edit: bool = False


@dataclass
class Run:
    """One run, checked and planned: what each mode (`run_here`, `run_shard`, `run_parent`) works from."""

    checked: Preflight
    options: RunOptions
    hooks: RunHooks
    units: list[Unit]
    """The plan's units; once the folder's state is read, with every variant of their requests
    (`plan_variants`)."""
    info: dict[str, Any]
    """What `run.json` says (`run.outputs.run_info`), completed as the run ends."""
    rate_limit: str | None
    """The name of the global limit's rate limit (`run.limits.rate_limit_of`), when it has one."""


# Over 60 lines only by its parameters and their docstring: the body is the run's story, a screen long.
@flow(
    name=FLOW_NAME,
    # At most one batch per unit in flight, plus the one being admitted (see run.dispatch).
    task_runner=ThreadPoolTaskRunner(max_workers=MAX_CONCURRENCY + 1),  # type: ignore[arg-type]  # Prefect's own generics
    log_prints=False,
    validate_parameters=True,
)
@concluded  # the summary becomes the run's final state; a stop under a worker is graceful (run.final_state)
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
    files_root: list[str] | None = None,
    allow_failures: str | None = None,
    shard_start_timeout: float = START_TIMEOUT,
    redo: str | None = None,
    edit: bool = False,
) -> dict[str, Any]:
    """Generate every image a manifest asks for into `out`, resuming from what `out` already holds.

    The API key is read from the Prefect Secret block named by `api_key_secret_block`, else from
    `IMAGEBATCH_API_KEY`; with no `base_url` (and no `IMAGEBATCH_BASE_URL`) the embedded emulator is used.
    `rpm` spaces request starts (60 / rpm seconds apart); `adaptive` (default) starts with a few requests
    in flight and adapts to the service's 429s (see `run.dispatch.Window`), never above `concurrency`.
    `max_images` caps the images this run may deliver (see `run.dispatch.Dispatcher`). `global_limit`
    names a Prefect global concurrency limit whose slot each request holds on the wire (`run.limits`).
    With `report=False` no thumbnail is made and no `report.html` written (`imagebatch report OUT` makes
    them later): a thumbnail costs ~15 ms of CPU per 1K image, as much as the rest of a request's work.
    With `shards` > 1 the run starts that many runs of `shard_deployment` (each `shard` I of them sends
    its share) on a work pool's workers (shard 0, and one no worker starts within `shard_start_timeout`
    seconds, run in this run's process), waits, and writes the records (see `run.shards`).
    `files_root` names folders reference images and masks may come from besides the manifest's folder.
    `allow_failures` (`3`, or `2.5%` of the requests) lets a run that was not stopped end Completed with
    that many requests not done (`run.final_state`).
    `redo="rejected"` sends a new variant of each request whose newest image a reviewer rejected, and
    nothing else new; with `edit`, as an edit turn on the rejected image with the reviewer's note where it
    can be (`work.variants`).
    The flow run ends Completed, Failed or Cancelled (`run.final_state.final_state`), its state's data the run
    summary (counts by status, paths), which is also written to `out/run.json`: call it with
    `return_state=True` and read the summary with `run.final_state.summary_of(state)`.
    """
    options = RunOptions(
        concurrency=concurrency, base_url=base_url, force=force, retry_unknown=retry_unknown,
        api_key_secret_block=api_key_secret_block, rpm=rpm, adaptive=adaptive, max_images=max_images,
        max_spend=max_spend, prices=prices, global_limit=global_limit, report=report, shards=shards,
        shard=shard, shard_deployment=shard_deployment, files_root=files_root,
        allow_failures=allow_failures, shard_start_timeout=shard_start_timeout, redo=redo, edit=edit,
    )  # fmt: skip
    hooks = current_hooks() or RunHooks()
    checked = hooks.checked or preflight(
        manifest, out, concurrency=concurrency, base_url=base_url,
        api_key_secret_block=api_key_secret_block, rpm=rpm, max_images=max_images,
        max_spend=max_spend, prices=prices, shard=shard is not None, files_root=files_root,
        deployed=deployment.id is not None, redo=redo, edit=edit, force=force,
    )  # fmt: skip
    if shards < 1 or (shard is not None and not 0 <= shard < shards):
        raise UsageError(f"shard {shard} of {shards}: shards must be 1 or more, and a shard 0 to shards - 1")
    rate_limit = rate_limit_of(global_limit) if global_limit else None  # a missing limit is refused here
    units = group_units(plan(checked.manifest))
    planned = sum(len(unit.requests) for unit in units)
    info = run_info(checked, planned, concurrency, force, retry_unknown, api_key_secret_block)
    info["options"] |= {
        "global_limit": global_limit, "report": report, "shards": shards, "shard": shard,
        "files_root": files_root, "allow_failures": allow_failures, "redo": redo, "edit": edit,
    }  # fmt: skip
    run = Run(checked, options, hooks, units, info, rate_limit)
    if shards > 1 and shard is None:
        return run_parent(run)  # start the shards' runs, wait for them, write the records
    if shard is not None:
        return run_shard(run)  # send this shard's units; the parent writes the records
    return run_here(run)  # send every unit, write the records


def run_here(run: Run) -> dict[str, Any]:
    """A run in this process: send its units, then write its records (`run.outputs`)."""
    checked, options = run.checked, run.options
    store = OutputStore(checked.out)
    with _output(run, store) as (url, key):
        states = store.load_state()
        held_keys = plan_variants(run, store, states)
        store.write_run(run.info)  # a crash leaves a run.json that says the run never ended
        ctx, tasks = _send(run, store, run.units, url, key, states, held_keys)
        run.info["sent"] = len(ctx.started_keys)
        try:
            return write_records(
                checked, store, run.units, ctx.results, run.info, ctx.halt_reason, tasks, options.report
            )
        finally:
            ctx.results.close()


def run_shard(run: Run) -> dict[str, Any]:
    """One shard of a sharded run: send its share of the units into its own journal; the parent writes the
    run's records once every shard has ended (`run_parent`)."""
    options, info = run.options, run.info
    assert options.shard is not None
    store = OutputStore(run.checked.out, shard_name(options.shard, options.shards))
    with _output(run, store) as (url, key):
        states = store.load_state()
        held_keys = plan_variants(run, store, states)
        units = [u for u in run.units if shard_of(u, options.shards) == options.shard]
        info["requests"] = sum(len(unit.requests) for unit in units)
        ctx, _tasks = _send(run, store, units, url, key, states, held_keys)
        try:
            counts = Counter(r.status for unit in units for r in ctx.results[unit.index])
            ended = datetime.now(UTC).isoformat()
            info |= {"ended_at": ended, "stopped": ctx.halt_reason, "counts": counts}
            return info
        finally:
            ctx.results.close()


def run_parent(run: Run) -> dict[str, Any]:
    """The parent of a sharded run: start `shards` runs of `shard_deployment` (`run.shards`), wait for
    them, merge their journals and write the run's records."""
    checked, options = run.checked, run.options
    if not options.shard_deployment:
        raise UsageError(f"{options.shards} shards need the deployment their runs use (shard_deployment)")
    parameters = {
        "manifest": checked.manifest.source, "out": out_text(checked.out),
        "concurrency": options.concurrency, "base_url": options.base_url, "force": options.force,
        "retry_unknown": options.retry_unknown, "api_key_secret_block": options.api_key_secret_block,
        "rpm": options.rpm, "adaptive": options.adaptive, "prices": options.prices,
        "global_limit": options.global_limit, "report": options.report, "files_root": options.files_root,
        "allow_failures": options.allow_failures, "redo": options.redo, "edit": options.edit,
    }  # fmt: skip
    store = OutputStore(checked.out)
    with held(store, sharded=options.shards):  # a bucket's lease, for the whole run (the shards' too)
        return _parent_records(run, store, options.shard_deployment, parameters)


def _parent_records(
    run: Run, store: OutputStore, deployment: str, parameters: dict[str, Any]
) -> dict[str, Any]:
    """The parent's part of a sharded run in the location it holds: its state before, the shards' runs,
    and the records once every shard has ended."""
    checked, options, hooks, info = run.checked, run.options, run.hooks, run.info
    with held(store):  # nothing else runs into the folder; the last sharded run's files are merged
        before = store.load_state()
        plan_variants(run, store, before)  # the shards plan the same from the same state
    runs = run_shards(
        deployment,
        parameters,
        options.shards,
        store,
        sleep=hooks.sleep,
        grace=hooks.shard_grace,
        start_timeout=options.shard_start_timeout,
        stopped=lambda: hooks.control.reason,  # a stop of the parent stops every shard
    )
    with held(store):  # every shard has ended: merge their journals, then the records
        if store.is_object_store:
            shards_released(store, options.shards, hooks.sleep)  # a killed shard's lease, until it expires
        after = store.load_state()
        failed = [
            f"shard {i}: {r['state']} ({r['message']})"
            for i, r in enumerate(runs)
            if not ran_to_end(r["state"], r["message"])
        ]
        results = records_after(run.units, before, after, "; ".join(failed) or "no shard sent it")
        info["shard_runs"] = runs
        # No task runs of its own to wait for at the end (the shards record theirs).
        halt_reason = hooks.control.reason or "; ".join(failed) or None
        return write_records(checked, store, run.units, results, info, halt_reason, 0, options.report)


@contextlib.contextmanager
def _output(run: Run, store: OutputStore) -> Iterator[tuple[str, str]]:
    """The run's service (its base URL and API key) and its output folder, held and prepared; our log
    lines go to Prefect's run log meanwhile."""
    with (
        prefect_guard.watching(),
        forward_logs_to_prefect("imagebatch"),
        service(run.checked.base_url, run.options.api_key_secret_block, run.hooks) as (url, key),
        held(store),
    ):
        store.prepare()
        yield url, key


def plan_variants(run: Run, store: OutputStore, states: dict[str, KeyState]) -> frozenset[str]:
    """Add every variant of the plan's requests to `run.units` (and, for `--redo rejected`, the new ones),
    from the folder's state as this run found it (`work.variants`); return the keys the run must not
    send (variants, outside a redo)."""
    options = run.options
    run.units, held_keys, redo = with_variants(
        run.units, states, store, redo=redo_kinds(options.redo), edit=options.edit,
        retry_unknown=options.retry_unknown,
    )  # fmt: skip
    run.info["requests"] = sum(len(unit.requests) for unit in run.units)
    if redo is not None:
        run.info["redo"] = redo.info()
    return held_keys


def _send(
    run: Run,
    store: OutputStore,
    units: list[Unit],
    url: str,
    key: str,
    states: dict[str, KeyState],
    held_keys: frozenset[str],
) -> tuple[RunContext, int]:
    """Send `units` (`run.dispatch`) with the run's client, limit, pacing, caps and signal handling;
    `states` is the folder's state as the run found it; return the run context (its records) and the
    number of Prefect task runs started."""
    options, hooks = run.options, run.hooks
    slots = SlotBroker(options.global_limit, run.rate_limit) if options.global_limit else None
    client = GatewayClient(
        url, key, sleep=hooks.sleep, transport=hooks.transport, slot=slots or contextlib.nullcontext
    )
    ctx = RunContext(
        client, store, states,
        force=options.force, retry_unknown=options.retry_unknown,
        key_source=key_source(options.api_key_secret_block), thumbnails=options.report,
        requests=sum(len(unit.requests) for unit in units), held=held_keys,
    )  # fmt: skip
    with (
        client,
        slots or contextlib.nullcontext(),
        hooks.signals() if hooks.signals else contextlib.nullcontext(),
    ):
        if options.rpm:
            ctx.pacer = Pacer(60.0 / options.rpm, sleep=hooks.sleep, clock=hooks.clock)
        progress = ProgressArtifact(hooks.on_progress)
        caps = budgets(options.max_images, options.max_spend, run.checked.prices)
        tasks = dispatch(ctx, units, options.concurrency, hooks.control, progress, options.adaptive, caps)
        progress.close()
    ctx.end_dispatch()
    return ctx, tasks
