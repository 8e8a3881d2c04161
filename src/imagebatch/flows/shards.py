"""Many machines: a run split into shards that run as separate flow runs on a work pool's workers.

The parent run (`shards=N`) plans once, starts N runs of the shard deployment (`NAME-shards`, made by
`imagebatch deploy --shards N`) with Prefect's `run_deployment`, waits for them, merges what they wrote
and writes the run's records. Shard `I` sends the units whose first idempotency key falls to it
(`shard_of`), so no two machines ever send one request; a chain's turns stay together. Every shard writes
into the one output folder (a network file system in production), each into its own journal and usage
file (`journal.shard-I-of-N.jsonl`), holding the folder's lock shared and its own shard lock alone.

What the folder must give across machines (NFSv4 does): a file renamed into place is seen whole
(`rename` is atomic within a directory), an `fsync` is durable on the server, and `flock` locks are seen
by every client (Linux maps them to NFS byte-range locks). Nothing else is shared: each shard appends
only to its own files, and the merge into `journal.jsonl` happens while the parent holds the folder alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from imagebatch.flows.constants import SHARD_GRACE, TERMINAL_STATES
from imagebatch.manifest.plan import key_digits
from imagebatch.tasks.context import Unit
from imagebatch.tasks.records import carried, not_attempted
from imagebatch.tasks.store import KeyState, OutputStore, RequestRecord


def shard_of(unit: Unit, shards: int) -> int:
    """Which shard sends `unit`: by its first idempotency key, so the split is the same on every machine
    and every rerun (a key's hex digits are uniform)."""
    return int(key_digits(unit.requests[0].idempotency_key)[:8], 16) % shards


def shard_name(shard: int, shards: int) -> str:
    return f"{shard}-of-{shards}"


def run_shards(
    deployment: str,
    parameters: dict[str, Any],
    shards: int,
    store: OutputStore,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    poll: float = 2.0,
    grace: float = SHARD_GRACE,
) -> list[dict[str, Any]]:
    """Start the N shard runs of `deployment` (as sub-runs of this flow run) and wait until each ends.
    Returns, per shard, its flow run's id, final state and message.

    A shard whose worker was killed never reports an end: its run stays Running on the server. Its
    process held its shard lock while it sent; a Running shard whose lock has been free for `grace`
    seconds (`SHARD_GRACE`: longer than a shard's start-up, before it takes the lock) is marked Crashed,
    and the run goes on: what it sent without an answer is `unknown`, what it never sent is sent by the
    next run."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Crashed

    started = [
        run_deployment(
            deployment,
            parameters={**parameters, "shard": i, "shards": shards, "shard_deployment": None},
            timeout=0,
            as_subflow=True,
            flow_run_name=f"shard {shard_name(i, shards)}",
        )
        for i in range(shards)
    ]
    ids = [run.id for run in started]  # type: ignore[union-attr]  # a FlowRun here (sync context)
    unheld: dict[int, float] = {}  # since when a Running shard's lock has been free
    with get_client(sync_client=True) as client:
        while True:
            runs = [client.read_flow_run(run_id) for run_id in ids]
            if all(run.state is not None and run.state.type.value in TERMINAL_STATES for run in runs):
                break
            for i, run in enumerate(runs):
                if (
                    run.state is None
                    or run.state.type.value != "RUNNING"
                    or store.shard_held(shard_name(i, shards))
                ):
                    unheld.pop(i, None)
                elif clock() - unheld.setdefault(i, clock()) > grace:
                    gone = f"shard {shard_name(i, shards)}: its process is gone (lock free for {grace:g} s)"
                    client.set_flow_run_state(run.id, Crashed(message=gone), force=True)
            sleep(poll)
    return [
        {"flow_run_id": str(run.id), "state": run.state.type.value if run.state else None,
         "message": run.state.message if run.state else None}
        for run in runs
    ]  # fmt: skip


def records_after(
    units: list[Unit], before: dict[str, KeyState], after: dict[str, KeyState], why_unsent: str
) -> dict[int, list[RequestRecord]]:
    """The parent's records, from the folder's state before the shards ran and after: a request that has
    succeeded only since is `succeeded`, one that had before `skipped`; the others carry their outcome,
    and one no shard reached is `not_attempted`."""
    results: dict[int, list[RequestRecord]] = {}
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
        results[unit.index] = out
    return results
