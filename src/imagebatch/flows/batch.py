"""The batch flow: check -> plan -> skip what is done -> dispatch -> records.

`generate_from_manifest` only orchestrates, in one of three modes: a run here (`run_here`), one shard of a
sharded run (`run_shard`), or the shards' parent (`run_parent`, with `run.shards`). Dispatch is
`run/dispatch.py` (with the `generate` task of `imagebatch.work.generate`), the end of the run (its
records and Prefect artifacts) `run/outputs.py`, the files are kept by `imagebatch.work.store`. Tasks
return nothing (their records go to the run context), so Prefect keeps no per-task results in memory.
The flow takes the manifest, the output and the run's options (`imagebatch.options`); a deployment made
before the options were one model still runs (`from_earlier_shape`).
"""

# No `from __future__ import annotations`: Prefect validates the flow's parameters against the annotations
# of `run.final_state.concluded`'s wrapper, resolved in that module's globals, which lack `RunOptions`.
import contextlib
import functools
import inspect
import logging
import secrets
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prefect import Flow
from prefect.exceptions import ParameterTypeError
from prefect.logging import get_run_logger
from prefect.runtime import deployment
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import ValidationError
from pydantic.json_schema import SkipJsonSchema

from imagebatch.gateway import GatewayClient
from imagebatch.manifest import plan
from imagebatch.options import MAX_CONCURRENCY, OWNER, RunOptions, ShardRole, environment_value
from imagebatch.run import api_guard as prefect_guard
from imagebatch.run.artifacts import ProgressArtifact, budgets
from imagebatch.run.constants import FLOW_NAME
from imagebatch.run.dispatch import dispatch
from imagebatch.run.final_state import concluded, ran_to_end
from imagebatch.run.hooks import RunHooks, current_hooks
from imagebatch.run.limits import SlotBroker, rate_limit_of
from imagebatch.run.outputs import run_info, write_records
from imagebatch.run.preflight import (
    Preflight,
    UsageError,
    key_source,
    locked,
    out_text,
    preflight,
    resolve_api_key,
)
from imagebatch.run.shards import (
    records_after,
    requests_to_send,
    run_shards,
    shard_name,
    shard_of,
    shard_parameters,
    shards_released,
)
from imagebatch.run.trust import Asked, Parent, Refused, policy_from_environment, refusal
from imagebatch.work.context import Pacer, RunContext, Unit, group_units
from imagebatch.work.redo import redo_kinds
from imagebatch.work.store import KeyState, OutputLockedError, OutputStore
from imagebatch.work.variants import with_variants


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
    from imagebatch.emulator import EmulatorServer, EmulatorSettings

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


@dataclass
class Run:
    """One run, checked and planned: what each mode (`run_here`, `run_shard`, `run_parent`) works from."""

    checked: Preflight
    options: RunOptions
    role: ShardRole
    hooks: RunHooks
    units: list[Unit]
    """The plan's units; once the folder's state is read, with every variant of their requests
    (`plan_variants`)."""
    info: dict[str, Any]
    """What `run.json` says (`run.outputs.run_info`), completed as the run ends."""
    rate_limit: str | None
    """The name of the global limit's rate limit (`run.limits.rate_limit_of`), when it has one."""


class BatchFlow(Flow[..., Any]):
    """The flow, reading the parameters of a deployment made before the options were one model."""

    def validate_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        validated = super().validate_parameters(from_earlier_shape(parameters))
        return {k: v for k, v in validated.items() if k in PARAMETERS}

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        unset_earlier = {k for k, v in parameters.items() if k in EARLIER and v is None}
        return super().serialize_parameters({k: v for k, v in parameters.items() if k not in unset_earlier})


def from_earlier_shape(parameters: dict[str, Any]) -> dict[str, Any]:
    """A deployment made by an earlier imagebatch gives every option as a parameter of its own
    (`concurrency=8`): read as the model's fields of those names, so its runs keep working unchanged.
    A name the model has not is refused, saying to redeploy."""
    flat = {k: v for k, v in parameters.items() if k not in PARAMETERS and v is not None}
    kept = {k: v for k, v in parameters.items() if k in PARAMETERS}
    if not flat:
        return kept
    role = {k: flat.pop(k) for k in list(flat) if k in ShardRole.model_fields}
    try:
        options = RunOptions.from_flat(**flat)
    except (ValueError, ValidationError) as exc:
        raise ParameterTypeError(f"{exc}; redeploy it with this imagebatch (`imagebatch deploy`)") from None
    return kept | {"options": options, "role": ShardRole(**role)}


@functools.partial(
    BatchFlow,
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
    options: RunOptions = RunOptions(),  # noqa: B008  # frozen: one instance is safe to share
    role: SkipJsonSchema[ShardRole | None] = None,
) -> dict[str, Any]:
    """Generate every image a manifest asks for into `out`, resuming from what `out` already holds.

    Args:
        manifest: The manifest: a CSV, JSON, JSON Lines, XLSX (FILE.xlsx#SHEET) or Parquet file, or a CSV
            or JSON object's URL (s3://bucket/m.csv).
        out: The output folder, or an object store's s3://bucket/prefix: a rerun sends only what is new.
        options: The run's options (`imagebatch.options`), each described where it is declared.
        role: Set by imagebatch for a sharded run's parts, never by a person (not in the form).

    The flow run ends Completed, Failed or Cancelled (`run.final_state`), its state's data the run summary,
    also written to `out/run.json`: call it with `return_state=True` and read it with
    `run.final_state.summary_of(state)`.
    """
    trusted(out, options, role or ShardRole())  # a deployment's run: before anything is read or sent
    run = start(manifest, out, options, role or ShardRole())
    if run.role.shard is not None:
        return run_shard(run)  # send this shard's units; the parent writes the records
    if options.sharding.shards > 1:
        return run_parent(run)  # start the shards' runs, wait for them, write the records
    return run_here(run)  # send every unit, write the records


PARAMETERS = frozenset(inspect.signature(generate_from_manifest.fn).parameters)
EARLIER = frozenset(OWNER) | frozenset(ShardRole.model_fields)
"""The flow's parameters before the options were one model: each option, a shard's number and deployment."""


def _accept_earlier_shape(batch: Flow[..., Any]) -> None:
    """Prefect binds a deployment run's parameters to the flow function's signature before the flow
    validates them (`from_earlier_shape`), so the signature it reads gains one keyword per earlier
    parameter, hidden from the form (`SkipJsonSchema`); the flow's form was made before, from the four."""
    signature, hide = inspect.signature(batch.fn), SkipJsonSchema[Any]  # type: ignore[misc]  # pydantic's marker
    hidden = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=hide)
        for name in sorted(EARLIER)
    ]
    batch.fn.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *hidden])  # type: ignore[attr-defined]


_accept_earlier_shape(generate_from_manifest)


def trusted(out: str, options: RunOptions, role: ShardRole) -> None:
    """A deployment's run asking what neither its deployment nor its worker allows is `Refused`
    (`run.trust`: its stored parameters, the parent of a shard's run, the worker's allow-lists); a run
    outside a deployment (a terminal's, a Python caller's) is its caller's own."""
    if deployment.id is None:
        return
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run.id)
        made = client.read_deployment(str(run.deployment_id))
        parent = None
        if role.shard is not None and run.parent_task_run_id is not None:
            task = client.read_task_run(run.parent_task_run_id)
            above = client.read_flow_run(task.flow_run_id) if task.flow_run_id else None
            if above is not None and (asked := _asked(above.parameters)) is not None:
                parent = Parent(asked, above.state.type.value if above.state else None)
    stored = _asked(made.parameters)
    name = f"{FLOW_NAME}/{made.name}"
    if stored is None:
        raise Refused(f"the parameters of deployment {name} are not this imagebatch's: redeploy it")
    policy = policy_from_environment()
    why = refusal(Asked(out, options, role), stored, name, policy, parent, environment_value("base_url"))
    if why:
        raise Refused(why)


def _asked(parameters: dict[str, Any]) -> Asked | None:
    """A run's (or deployment's) stored parameters as the flow reads them, or None when it cannot."""
    try:
        valid = generate_from_manifest.validate_parameters(parameters)
    except (ParameterTypeError, ValidationError, TypeError, ValueError):
        return None
    return Asked(str(valid["out"]), valid.get("options") or RunOptions(), valid.get("role") or ShardRole())


def start(manifest: str, out: str, options: RunOptions, role: ShardRole) -> Run:
    """The run checked (`preflight`, unless the command made it) and planned, its run.json begun."""
    hooks = current_hooks() or RunHooks()
    shard, shards = role.shard, options.sharding.shards
    checked = hooks.checked or preflight(
        manifest, out, options, shard=shard is not None, deployed=deployment.id is not None
    )
    if shard is not None and not 0 <= shard < shards:
        raise UsageError(f"shard {shard} of {shards}: a shard is 0 to shards - 1")
    limit = options.pacing.global_limit
    rate_limit = rate_limit_of(limit) if limit else None  # a missing limit is refused here
    units = group_units(plan(checked.manifest))
    planned = sum(len(unit.requests) for unit in units)
    info = run_info(checked, planned, options, shard)
    return Run(checked, options, role, hooks, units, info, rate_limit)


def run_here(run: Run) -> dict[str, Any]:
    """A run in this process: send its units, then write its records (`run.outputs`)."""
    checked, report = run.checked, run.options.outcome.report
    store = OutputStore(checked.out)
    with _output(run, store) as (url, key):
        states = store.load_state()
        held_keys = plan_variants(run, store, states)
        if dead := store.settle_dead_run(datetime.now(UTC).isoformat()):  # the last run's, before this one's
            run.info["previous"] = dead.as_previous()
        store.write_run(run.info)  # a crash leaves a run.json that says the run never ended
        ctx, tasks = _send(run, store, run.units, url, key, states, held_keys)
        run.info["sent"] = len(ctx.started_keys)
        try:
            return write_records(
                checked, store, run.units, ctx.results, run.info, ctx.halt_reason, tasks, report
            )
        finally:
            ctx.results.close()


def run_shard(run: Run) -> dict[str, Any]:
    """One shard of a sharded run: send its share of the units into its own journal; the parent writes the
    run's records once every shard has ended (`run_parent`)."""
    info, shard, shards = run.info, run.role.shard, run.options.sharding.shards
    assert shard is not None
    store = OutputStore(run.checked.out, shard_name(shard, shards))
    with _output(run, store) as (url, key):
        states = store.load_state()
        held_keys = plan_variants(run, store, states)
        units = [u for u in run.units if shard_of(u, shards) == shard]
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
    shards, deployment_name = run.options.sharding.shards, run.role.shard_deployment
    if not deployment_name:
        raise UsageError(f"{shards} shards need the deployment their runs use (imagebatch deploy --shards)")
    store = OutputStore(run.checked.out)
    with held(store, sharded=shards):  # a bucket's lease, for the whole run (the shards' too)
        return _parent_records(run, store, deployment_name)


def _parent_records(run: Run, store: OutputStore, deployment_name: str) -> dict[str, Any]:
    """The parent's part of a sharded run in the location it holds: its state before, the shards' runs
    (each with its part of the budgets: `run.shards.shard_parameters`), and the records once every shard
    has ended."""
    checked, options, hooks, info = run.checked, run.options, run.hooks, run.info
    shards = options.sharding.shards
    with held(store):  # nothing else runs into the folder; the last sharded run's files are merged
        before = store.load_state()
        held_keys = plan_variants(run, store, before)  # the shards plan the same from the same state
    source, out = checked.manifest.source, out_text(checked.out)
    to_send = requests_to_send(options, run.units, before, held_keys)
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
        start_timeout=options.sharding.shard_start_timeout,
        stopped=lambda: hooks.control.reason,  # a stop of the parent stops every shard
    )
    with held(store):  # every shard has ended: merge their journals, then the records
        shards_released(store, shards, hooks.sleep)  # a killed shard's lease, until it expires
        after = store.load_state()
        failed = [
            f"shard {r['shard']}: {r['state']} ({r['message']})"
            for r in runs
            if not ran_to_end(r["state"], r["message"])
        ]
        results = records_after(run.units, before, after, "; ".join(failed) or "no shard sent it")
        info["shard_runs"] = runs
        # No task runs of its own to wait for at the end (the shards record theirs).
        halt_reason = hooks.control.reason or "; ".join(failed) or None
        report = options.outcome.report
        return write_records(checked, store, run.units, results, info, halt_reason, 0, report)


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


def plan_variants(run: Run, store: OutputStore, states: dict[str, KeyState]) -> frozenset[str]:
    """Add every variant of the plan's requests to `run.units` (and, for `--redo rejected`, the new ones),
    from the folder's state as this run found it (`work.variants`); return the keys the run must not
    send (variants, outside a redo)."""
    resend = run.options.resend
    run.units, held_keys, redo = with_variants(
        run.units, states, store, redo=redo_kinds(resend.redo), edit=resend.edit,
        retry_unknown=resend.retry_unknown,
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
    options, hooks, pacing = run.options, run.hooks, run.options.pacing
    limit = pacing.global_limit
    slots = SlotBroker(limit, run.rate_limit) if limit else None
    client = GatewayClient(
        url, key, sleep=hooks.sleep, transport=hooks.transport, slot=slots or contextlib.nullcontext
    )
    ctx = RunContext(
        client, store, states,
        force=options.resend.force, retry_unknown=options.resend.retry_unknown,
        key_source=key_source(options.service.api_key_secret_block), thumbnails=options.outcome.report,
        requests=sum(len(unit.requests) for unit in units), held=held_keys,
    )  # fmt: skip
    with (
        client,
        slots or contextlib.nullcontext(),
        hooks.signals() if hooks.signals else contextlib.nullcontext(),
    ):
        if pacing.rpm:
            ctx.pacer = Pacer(60.0 / pacing.rpm, sleep=hooks.sleep, clock=hooks.clock)
        progress = ProgressArtifact(hooks.on_progress)
        caps = budgets(options.budgets.max_images, options.budgets.max_spend, run.checked.prices)
        tasks = dispatch(ctx, units, pacing.concurrency, hooks.control, progress, pacing.adaptive, caps)
        progress.close()
    ctx.end_dispatch()
    return ctx, tasks
