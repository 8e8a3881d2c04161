"""A rerun with nothing to send, settled without Prefect.

Most reruns of a nightly manifest or a catalog find every request done (or left alone: `no_image`, and
`unknown` without `--retry-unknown`). Starting Prefect for them costs about four seconds (importing it,
its temporary server) and sends nothing. So `imagebatch run` first asks the output location (a folder or
a bucket): if no request of the plan is to be sent, it writes the run's records exactly as the flow would
(results.csv, usage-summary.csv, run.json, the report: `run.outputs.write_files`, under the folder's
lock or the bucket's lease), prints the same summary and exit code, and never starts Prefect.

What Prefect sees of such a run: nothing (no flow run, no artifacts). `run.json` says so: its `prefect`
entry is `{"flow_run_id": null, "task_runs": 0, "started": false}`. This path is taken only on Prefect's
temporary server (no `PREFECT_API_URL`): a team's Prefect server records every run, even one that sends
nothing, and deployments always run the flow.
"""

from __future__ import annotations

from typing import Any

from imagebatch.options import RunOptions
from imagebatch.run.outputs import run_info, write_files
from imagebatch.run.plan import RunPlan
from imagebatch.run.preflight import Preflight, key_source
from imagebatch.run.settled import NOT_STARTED, PathSpool, PlanDigest, leave_seal, settle_from_seal
from imagebatch.work.context import RunContext, RunState, sends
from imagebatch.work.redo import redo_kinds
from imagebatch.work.spool import RecordSpool
from imagebatch.work.store import OutputLockedError, OutputStore
from imagebatch.work.unit import run_unit
from imagebatch.work.variants import Variants

__all__ = ["NOT_STARTED", "settle_without_prefect"]


def settle_without_prefect(checked: Preflight, options: RunOptions) -> dict[str, Any] | None:
    """The run's summary if it has nothing to send (its records written), else None (the flow runs).

    None too when the location has no journal yet (a first run) or is held by another run (the flow
    then says so as usual). An output in a bucket is settled the same way, under its lease: the rerun
    then reads the lease, one listing and the compacted journal, and writes the run's records."""
    if options.resend.force:
        return None
    store = OutputStore(checked.out)
    if not _has_journal(store):
        return None
    try:
        with store.backend.hold():
            return settle_from_seal(checked, options, store) or _settle(checked, store, options)
    except OutputLockedError:
        return None


def _has_journal(store: OutputStore) -> bool:
    """Whether a run was here before (one look: a file, or a listing)."""
    return store.backend.has_records()


def _settle(checked: Preflight, store: OutputStore, options: RunOptions) -> dict[str, Any] | None:
    states = store.load_state(spool=store.backend.spool_folder)
    resend, report = options.resend, options.outcome.report
    variants = Variants(
        states, store, redo=redo_kinds(resend.redo), edit=resend.edit, retry_unknown=resend.retry_unknown
    )
    plan = RunPlan(checked.manifest.jobs)
    plan.count(variants)
    # A seal only where the plan is the manifest's alone (no variant), and no key waits on files to come.
    sealed = resend.redo is None and not states.newest and not variants.held and variants.summary is None
    ctx = RunContext(None, store, states, RunState(RecordSpool()), retry_unknown=resend.retry_unknown,  # type: ignore[arg-type]  # no request is sent: no client
                     key_source=key_source(options.service.api_key_secret_block), thumbnails=report,
                     held=variants.held)  # fmt: skip
    results = RecordSpool(store.backend.spool_folder)
    digest, paths = PlanDigest(checked.manifest.metadata_columns), PathSpool(store.backend.spool_folder)
    try:
        for unit in plan:  # recorded as they come, until the first request to send
            if sends(unit, ctx.decision):
                return None
            results[unit.index] = records = run_unit(ctx, unit)
            digest.add(unit)
            sealed = sealed and all(r.status != "unknown" for r in records)
            if sealed:  # the files the seal names, kept on disk: never a list of them
                paths.add(path for r in records for path in r.paths)
        info = run_info(checked, plan.requests, options)  # as the flow records them (flows.batch)
        info["sent"] = 0
        if variants.summary is not None:
            info["redo"] = variants.summary.info()
        info = write_files(checked, store, plan, results, info, None, report, dict(NOT_STARTED))
        if sealed:
            leave_seal(checked, options, store, digest.hexdigest(), paths, info)
        return info
    finally:
        paths.close()
        results.close()
        ctx.state.results.close()
