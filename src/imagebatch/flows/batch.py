"""The batch flow, `generate_from_manifest`, as the story of one run: check what it may do and what it is
asked, plan the manifest into units of requests, send them, and conclude.

- **Check**: a deployment's run asking what its deployment or worker does not allow is refused before it
  reads or sends anything (`run.deployed`); the manifest, the output location, the prices and the key are
  checked by `run.preflight`, unless the command checked them already.
- **Plan**: one request and idempotency key per image and turn (`manifest.plan`), grouped into units.
- **Send**, in one of three modes (`run.modes`): here, in this process; as one shard of a sharded run; or
  as the shards' parent, which starts them and waits.
- **Conclude**: the run summary becomes the flow run's final state, Completed, Failed or Cancelled
  (`run.final_state.concluding`), also written to `out/run.json`.

The flow takes the manifest, the output and the run's options (`imagebatch.options`); a deployment made by
an earlier imagebatch, whose runs give each option alone, still runs (`flows.compat`).
"""

from __future__ import annotations

import functools
from typing import Any

from prefect.runtime import deployment
from prefect.states import State
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic.json_schema import SkipJsonSchema

from imagebatch.errors import UsageError
from imagebatch.flows.compat import EARLIER_RUN, EarlierShapeFlow, run_options_of
from imagebatch.options import MAX_CONCURRENCY, RunOptions, ShardRole
from imagebatch.run.constants import FLOW_NAME
from imagebatch.run.deployed import trusted
from imagebatch.run.final_state import concluding
from imagebatch.run.hooks import RunHooks, current_hooks
from imagebatch.run.limits import rate_limit_of
from imagebatch.run.modes import Run, run_here, run_parent, run_shard
from imagebatch.run.outputs import run_info
from imagebatch.run.plan import RunPlan
from imagebatch.run.preflight import preflight
from imagebatch.run.shards import shard_keeps


@functools.partial(
    EarlierShapeFlow,
    name=FLOW_NAME,
    earlier=EARLIER_RUN,
    fold=run_options_of,
    # At most one batch per unit in flight, plus the one being admitted (see run.dispatch).
    task_runner=ThreadPoolTaskRunner(max_workers=MAX_CONCURRENCY + 1),
    log_prints=False,
    validate_parameters=True,
)
def generate_from_manifest(
    manifest: str,
    out: str,
    options: RunOptions = RunOptions(),  # noqa: B008  # frozen: one instance is safe to share
    role: SkipJsonSchema[ShardRole | None] = None,
) -> State[Any]:
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
    role = role or ShardRole()
    with concluding(options, role) as end:
        trusted(out, options, role)  # a deployment's run: before anything is read or sent
        run = start(manifest, out, options, role)
        if role.shard is not None:
            end.summary = run_shard(run)  # send this shard's units; the parent writes the records
        elif options.sharding.shards > 1:
            end.summary = run_parent(run)  # start the shards' runs, wait for them, write the records
        else:
            end.summary = run_here(run)  # send every unit, write the records
    return end.state


def start(manifest: str, out: str, options: RunOptions, role: ShardRole) -> Run:
    """The run checked (`preflight`, unless the command made it) and planned, its run.json begun."""
    hooks = current_hooks() or RunHooks()
    shard, shards = role.shard, options.sharding.shards
    keep = shard_keeps(shard, shards) if shard is not None else None  # a shard holds only its own jobs
    checked = hooks.checked or preflight(
        manifest, out, options, shard=shard is not None, deployed=deployment.id is not None, keep=keep
    )
    if shard is not None and not 0 <= shard < shards:
        raise UsageError(f"shard {shard} of {shards}: a shard is 0 to shards - 1")
    limit = options.pacing.global_limit
    rate_limit = rate_limit_of(limit) if limit else None  # a missing limit is refused here
    info = run_info(checked, 0, options, shard)  # its `requests` counted with the variants (run.modes)
    return Run(checked, options, role, hooks, RunPlan(checked.manifest.jobs), info, rate_limit)
