"""A rerun that sends nothing, settled from the seal the last such rerun left while none of it changed.

`run.nothing_to_send` settles a rerun in full: it replays the journal, plans the manifest, decides every
key and writes results.csv, usage-summary.csv and run.json, all in proportion to the folder's size. When it
finds nothing to send it leaves a seal (`layout.SETTLED`): what it settled on (the records' stamp, a
digest of the plan's keys and metadata, the options that decide, imagebatch's version), the files its
records name, and what run.json said of those records (counts, usage, spend). A later rerun that finds
all of that unchanged, and every named file still there, would write the same results.csv and
usage-summary.csv: it writes only run.json (and the report, when asked), at the cost of reading the
manifest, planning it once and looking the files up. Anything else (a changed row, a deleted image, a
record written or edited since, another option, a seal that cannot be read) and the rerun is settled in
full, as without a seal: a seal is trusted only as far as it can be checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable
from typing import Any

import imagebatch
from imagebatch.options import RunOptions
from imagebatch.run.outputs import run_info, write_summary
from imagebatch.run.plan import RunPlan
from imagebatch.run.preflight import Preflight
from imagebatch.storage import layout
from imagebatch.work.context import Unit
from imagebatch.work.store import OutputStore

NOT_STARTED = {"flow_run_id": None, "task_runs": 0, "started": False}
"""What run.json says of Prefect for a run settled without it (`run.nothing_to_send`)."""
SEAL_FORMAT = 1
CARRIED = ("requests", "usage", "spend", "rate_limited", "counts", "superseded")
"""What run.json says of the records, carried from the seal into a rerun settled from it."""


class PlanDigest:
    """A digest of the plan as results.csv depends on it: the metadata columns, then each request's key
    and its job's metadata, in the plan's order."""

    def __init__(self, metadata_columns: Iterable[str]) -> None:
        self._hash = hashlib.sha256(json.dumps(list(metadata_columns)).encode())

    def add(self, unit: Unit) -> None:
        metadata = repr(sorted(unit.job.metadata.items())).encode()
        for req in unit.requests:
            self._hash.update(f"{req.idempotency_key}\0".encode() + metadata + b"\n")

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def settled_on(
    checked: Preflight, options: RunOptions, store: OutputStore, plan_digest: str
) -> dict[str, Any]:
    """Everything a settled rerun's records follow from, besides the files they name (JSON as stored)."""
    prices = checked.prices
    inputs = {
        "format": SEAL_FORMAT,
        "imagebatch": imagebatch.__version__,
        "records": store.backend.records_stamp(),
        "manifest_sha256": checked.manifest.sha256,
        "plan": plan_digest,
        "retry_unknown": options.resend.retry_unknown,
        "prices": None if prices is None else {"images": prices.images, "currency": prices.currency},
    }
    loaded: dict[str, Any] = json.loads(json.dumps(inputs))
    return loaded


def leave_seal(
    checked: Preflight,
    options: RunOptions,
    store: OutputStore,
    plan_digest: str,
    paths: list[str],
    info: dict[str, Any],
) -> None:
    """Write the seal of a rerun just settled in full (its records written: a record not written leaves
    none). Best effort: a seal not written only means the next rerun is settled in full."""
    if info.get("unwritten"):
        return
    seal = {
        "settled_on": settled_on(checked, options, store, plan_digest),
        "paths": paths,
        "info": {name: info[name] for name in CARRIED if name in info},
    }
    with contextlib.suppress(OSError):
        store.backend.put(layout.SETTLED, json.dumps(seal, separators=(",", ":")).encode())


def settle_from_seal(checked: Preflight, options: RunOptions, store: OutputStore) -> dict[str, Any] | None:
    """The run's summary, run.json (and the report) written, if the seal still holds; else None (settle
    in full). The cheap checks first (the records' stamp, the options), then one pass of the plan, then
    the files. `--redo` and `--edit` never settle from it (they read review decisions)."""
    resend = options.resend
    if resend.redo is not None or resend.edit:
        return None
    seal = _read_seal(store)
    if seal is None:
        return None
    expected = seal["settled_on"]
    if settled_on(checked, options, store, expected.get("plan", "")) != expected:
        return None
    plan = RunPlan(checked.manifest.jobs)
    digest = PlanDigest(checked.manifest.metadata_columns)
    for unit in plan:
        digest.add(unit)
    if digest.hexdigest() != expected["plan"] or not store.backend.files_exist(seal["paths"], True):
        return None
    info = run_info(checked, seal["info"]["requests"], options) | seal["info"]
    info["sent"] = 0
    return write_summary(store, plan, info, None, options.outcome.report, dict(NOT_STARTED), [])


def _read_seal(store: OutputStore) -> dict[str, Any] | None:
    """The seal, or None when there is none or it is not one this code wrote."""
    try:
        data = store.backend.get(layout.SETTLED)
        seal = json.loads(data) if data is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(seal, dict) or not isinstance(seal.get("settled_on"), dict):
        return None
    paths, info = seal.get("paths"), seal.get("info")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("requests"), int):
        return None
    return seal
