"""Many machines: a run split into shards that run as separate flow runs on a work pool's workers.

The parent run (`shards=N`) plans once, starts a run of the shard deployment (`NAME-shards`, made by
`imagebatch deploy --shards N`) with Prefect's `run_deployment` for each of the N shards that has something
to send, runs the first itself (and any shard no worker takes within a minute), so that it never holds a
worker's slot only to wait, waits for the others (`run.shard_runs`: the shards' flow runs on Prefect),
merges what they wrote and writes the run's records. Shard `I` sends the units whose request's first
sample's idempotency key falls to it (`shard_of`), so no two machines ever send one request; a chain's turns
and a request's later samples stay together, and a shard keeps only its own jobs as it reads the manifest
(`shard_keeps`). Every shard writes into the one output folder (a network file system in production), each
into its own journal and usage file (`journal.shard-I-of-N.jsonl`), holding the folder's lock shared and its
own shard lock alone. Into an object store's prefix (a bucket: the machines share nothing else), each writes
its own journal segments (`journal/<run>-I-of-N-<seq>.jsonl`) under a lease of its own, while the parent
holds the prefix's lease for the whole run (`Backend.hold_sharded`, `shard_hold`); the parent compacts the
segments into one object once every shard has ended.

What the folder must give across machines (NFSv4 does): a file renamed into place is seen whole
(`rename` is atomic within a directory), an `fsync` is durable on the server, and `flock` locks are seen
by every client (Linux maps them to NFS byte-range locks). Nothing else is shared: each shard appends
only to its own files, and the merge into `journal.jsonl` happens while the parent holds the folder alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from imagebatch.manifest import Job
from imagebatch.manifest.plan import idempotency_key, key_digits
from imagebatch.options import RunOptions, ShardRole, split_budgets
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
