"""The three ways a checked and planned run sends: here, in this process (`run_here`); as one shard of a
sharded run (`run_shard`); or as the shards' parent (`run_parent`), which sends nothing itself, starts the
shards' runs (`run.shards`) and writes the records once they have ended. Each returns the run summary
that `run.final_state.concluding` turns into the flow run's final state.

Dispatch is `run.dispatch` (with the `generate` task of `run.batches`), the end of the run
(its records and Prefect artifacts) `run.outputs`, the files are kept by `imagebatch.work.store`. Tasks
return nothing (their records go to the run context), so Prefect keeps no per-task results in memory.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prefect.logging import get_run_logger

from imagebatch.errors import UsageError
from imagebatch.gateway import GatewayClient
from imagebatch.options import RunOptions, ShardRole
from imagebatch.run import api_guard as prefect_guard
from imagebatch.run.artifacts import ProgressArtifact, budgets
from imagebatch.run.dispatch import Dispatcher
from imagebatch.run.final_state import ran_to_end
from imagebatch.run.hooks import RunHooks
from imagebatch.run.limits import SlotBroker
from imagebatch.run.log_forwarding import forward_logs_to_prefect
from imagebatch.run.outputs import write_records
from imagebatch.run.pacing import Pacer
from imagebatch.run.plan import RunPlan
from imagebatch.run.preflight import Preflight, key_source, locked, out_text
from imagebatch.run.service import service
from imagebatch.run.shard_runs import UNKNOWN, run_shards
from imagebatch.run.shards import (
    records_after,
    requests_to_send,
    shard_name,
    shard_of,
    shard_parameters,
    shards_released,
)
from imagebatch.work.context import (
    Decision,
    RunContext,
    RunState,
    Unit,
    decide,
    sends,
    stop_on_write_failure,
)
from imagebatch.work.redo import redo_kinds
from imagebatch.work.spool import DiskReserve, RecordSpool, reserve_size
from imagebatch.work.store import KeyState, OutputLockedError, OutputStore
from imagebatch.work.variants import Variants


@dataclass
class Run:
    """One run, checked and planned: what each mode works from."""

    checked: Preflight
    options: RunOptions
    role: ShardRole
    hooks: RunHooks
    plan: RunPlan
    """The plan's units, planned again on each pass; once the folder's state is read, with every variant
    of their requests (`plan_variants`), and counted."""
    info: dict[str, Any]
    """What `run.json` says (`run.outputs.run_info`), completed as the run ends."""
    rate_limit: str | None
    """The name of the global limit's rate limit (`run.limits.rate_limit_of`), when it has one."""


def run_here(run: Run) -> dict[str, Any]:
    """A run in this process: send its units, then write its records (`run.outputs`)."""
    checked, report = run.checked, run.options.outcome.report
    store = OutputStore(checked.out)
    with _output(run, store) as (url, key):
        states = store.load_state(spool=store.backend.spool_folder)
        held_keys = plan_variants(run, store, states)
        if dead := store.settle_dead_run(datetime.now(UTC).isoformat()):  # the last run's, before this one's
            run.info["previous"] = dead.as_previous()
        store.write_run(run.info)  # a crash leaves a run.json that says the run never ended
        with _dispatcher(run, store, url, key, states, held_keys) as dispatcher:
            tasks = dispatcher.run()
        ctx = dispatcher.ctx
        run.info["sent"] = len(ctx.state.started_keys)
        try:
            return write_records(
                checked, store, run.plan, ctx.state.results, run.info, ctx.state.halt_reason, tasks, report
            )
        finally:
            ctx.state.results.close()


def run_shard(run: Run) -> dict[str, Any]:
    """One shard of a sharded run: send its share of the units into its own journal; the parent writes the
    run's records once every shard has ended (`run_parent`)."""
    info, shard, shards = run.info, run.role.shard, run.options.sharding.shards
    assert shard is not None
    store = OutputStore(run.checked.out, shard_name(shard, shards))
    run.plan.keep = functools.partial(_in_shard, shard=shard, shards=shards)
    with _output(run, store) as (url, key):
        states = store.load_state(spool=store.backend.spool_folder)
        held_keys = plan_variants(run, store, states)  # its own units counted: its `requests`
        with _dispatcher(run, store, url, key, states, held_keys) as dispatcher:
            dispatcher.run()
        ctx = dispatcher.ctx
        ctx.state.results.close()
        # Every unit's records counted as the dispatcher settled them: no pass over the plan again.
        ended = datetime.now(UTC).isoformat()
        info |= {"ended_at": ended, "stopped": ctx.state.halt_reason, "counts": dispatcher.progress.counts}
        return info


def _in_shard(unit: Unit, *, shard: int, shards: int) -> bool:
    return shard_of(unit, shards) == shard


def run_parent(run: Run) -> dict[str, Any]:
    """The parent of a sharded run: start `shards` runs of `shard_deployment` (`run.shards`), wait for
    them, merge their journals and write the run's records."""
    shards, deployment_name = run.options.sharding.shards, run.role.shard_deployment
    if not deployment_name:
        raise UsageError(f"{shards} shards need the deployment their runs use (imagebatch deploy --shards)")
    store = OutputStore(run.checked.out)
    with (
        prefect_guard.watching(),  # Prefect's server lost: the shards are watched without it
        held(store, sharded=shards),  # a bucket's lease, for the whole run (the shards' too)
    ):
        return _parent_records(run, store, deployment_name)


def _parent_records(run: Run, store: OutputStore, deployment_name: str) -> dict[str, Any]:
    """The parent's part of a sharded run in the location it holds: its state before, the shards' runs
    (each with its part of the budgets: `run.shards.shard_parameters`), and the records once every shard
    has ended."""
    checked, options, hooks, info = run.checked, run.options, run.hooks, run.info
    shards = options.sharding.shards
    with held(store):  # nothing else runs into the folder; the last sharded run's files are merged
        before = store.load_state(spool=store.backend.spool_folder)
        held_keys = plan_variants(run, store, before)  # the shards plan the same from the same state
    source, out = checked.manifest.source, out_text(checked.out)
    to_send = requests_to_send(options, run.plan, before, held_keys)
    parameters = shard_parameters(source, out, options, to_send)
    if idle := [shard_name(i, shards) for i in range(shards) if i not in parameters]:
        get_run_logger().info("Shard(s) %s: nothing to send; not started", ", ".join(idle))
    runs = run_shards(
        deployment_name,
        parameters,
        shards,
        store,
        sleep=hooks.sleep,
        grace=hooks.shard_grace,
        never_started=hooks.shard_never_started,
        start_timeout=options.sharding.shard_start_timeout,
        stopped=lambda: hooks.control.reason,  # a stop of the parent stops every shard
        lost=prefect_guard.current().lost.is_set,
        lose=prefect_guard.current().lose,
    )
    ends = ", ".join(f"{shard_name(r['shard'], shards)} {str(r['state']).lower()}" for r in runs)
    get_run_logger().info("Every shard has ended (%s); writing the run's records", ends or "none started")
    with held(store):  # every shard has ended: merge their journals, then the records
        store.backend.shut_out_shards()  # none starts late beside the merge (a bucket's parent lease)
        shards_released(store, shards, hooks.sleep)  # a killed shard's lease, until it expires
        after = store.load_state(spool=store.backend.spool_folder)
        failed = [r for r in runs if not ran_to_end(r["state"], r["message"])]
        why_unsent = "; ".join(_said(r) for r in failed) or "no shard sent it"
        # A shard whose end Prefect's server was lost before telling stopped the run only if its records
        # say so (requests not done): the verdict reads those, not its state.
        broke = [_said(r) for r in failed if r["state"] != UNKNOWN]
        results = RecordSpool(store.backend.spool_folder)
        try:
            for index, records in records_after(run.plan, before, after, why_unsent):
                results[index] = records
            info["shard_runs"] = runs
            # No task runs of its own to wait for at the end (the shards record theirs).
            halt_reason = hooks.control.reason or "; ".join(broke) or None
            report = options.outcome.report
            return write_records(checked, store, run.plan, results, info, halt_reason, 0, report)
        finally:
            results.close()


def _said(shard_run: dict[str, Any]) -> str:
    return f"shard {shard_run['shard']}: {shard_run['state']} ({shard_run['message']})"


@contextlib.contextmanager
def held(store: OutputStore, sharded: int = 0) -> Iterator[None]:
    """The output folder's lock for this run (a second run into it would send twice); `sharded`: for the
    whole of a sharded run's parent (`Backend.hold_sharded`: an object store's lease, nothing more
    for a folder)."""
    try:
        if sharded:
            hold = store.backend.hold_sharded(sharded)
        else:
            hold = store.backend.shard_hold() if store.shard else store.backend.hold()
        with hold:
            yield
    except OutputLockedError as exc:
        raise locked(exc) from None


@contextlib.contextmanager
def _output(run: Run, store: OutputStore) -> Iterator[tuple[str, str]]:
    """The run's service (its base URL and API key) and its output folder, held and prepared; our log
    lines go to Prefect's run log meanwhile."""
    with (
        prefect_guard.watching(),
        forward_logs_to_prefect("imagebatch"),
        service(run.checked.base_url, run.options.service.api_key_secret_block, run.hooks) as (url, key),
        held(store),
    ):
        store.backend.prepare()
        yield url, key


def plan_variants(run: Run, store: OutputStore, states: Mapping[str, KeyState]) -> frozenset[str]:
    """Add every variant of the plan's requests to `run.plan` (and, for `--redo rejected`, the new ones),
    from the folder's state as this run found it (`work.variants`), and count its requests and the units
    to send (by the run's own rule, `work.context.decide`); return the keys the run must not send
    (variants, outside a redo)."""
    resend = run.options.resend
    variants = Variants(
        states, store, redo=redo_kinds(resend.redo), edit=resend.edit, retry_unknown=resend.retry_unknown
    )

    def decision(key: str) -> Decision:
        held = variants.holds(key)
        return decide(states.get(key), force=resend.force, retry_unknown=resend.retry_unknown, held=held)

    run.plan.count(variants, functools.partial(sends, decision=decision))
    run.info["requests"] = run.plan.requests
    if variants.summary is not None:
        run.info["redo"] = variants.summary.info()
    return variants.held


@contextlib.contextmanager
def _dispatcher(
    run: Run,
    store: OutputStore,
    url: str,
    key: str,
    states: Mapping[str, KeyState],
    held_keys: frozenset[str],
) -> Iterator[Dispatcher]:
    """The run's dispatcher (`run.dispatch.Dispatcher`: its `run` sends the run's units), with the run's
    client, limit, pacing, caps and signal handling in place while the caller runs it; `states` is the
    folder's state as the run found it. Its `ctx` holds the records once it has run."""
    options, hooks, pacing = run.options, run.hooks, run.options.pacing
    limit = pacing.global_limit
    slots = SlotBroker(limit, run.rate_limit) if limit else None
    client = GatewayClient(
        url, key, sleep=hooks.sleep, transport=hooks.transport, slot=slots or contextlib.nullcontext
    )
    pacer = Pacer(60.0 / pacing.rpm, sleep=hooks.sleep, clock=hooks.clock) if pacing.rpm else None
    state = RunState(RecordSpool(store.backend.spool_folder), pace=pacer.wait if pacer else None)
    stop_on_write_failure(store, state)
    ctx = RunContext(
        client, store, states, state,
        force=options.resend.force, retry_unknown=options.resend.retry_unknown,
        key_source=key_source(options.service.api_key_secret_block), thumbnails=options.outcome.report,
        held=held_keys,
    )  # fmt: skip
    # Room for the run's end on a full disk, given back once nothing more is sent or saved.
    reserve = DiskReserve(store.backend.spool_folder, reserve_size(run.plan.requests))
    with (
        client,
        slots or contextlib.nullcontext(),
        hooks.signals() if hooks.signals else contextlib.nullcontext(),
    ):
        progress = ProgressArtifact(hooks.on_progress)
        caps = budgets(options.budgets.max_images, options.budgets.max_spend, run.checked.prices)
        yield Dispatcher(
            ctx, run.plan, run.plan.requests, run.plan.to_send, pacing.concurrency, hooks.control, progress,
            pacing.adaptive, caps,
        )  # fmt: skip
        progress.close()
    reserve.release()
